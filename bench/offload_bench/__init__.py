"""Helpers of `bench/bench_moe_offload.py`: stream timing arithmetic, the needle prompt, the
server process and its metrics, the HTTP client, host→GPU bandwidth and the report writer."""
