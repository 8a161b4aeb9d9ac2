"""MoE expert offload: experts in pinned host memory, per-layer GPU slot caches."""
