"""The engine: requests, the scheduler (continuous batching, chunked prefill), the paged KV
block allocator and the `add_request` / `step()` loop."""
