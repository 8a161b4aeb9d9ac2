"""Tensor parallelism over `torch.distributed` (NCCL on GPUs, gloo on CPUs): rank 0 runs the
engine and broadcasts every step's inputs; the other ranks follow. The sharding is declared
beside the layers (`tp_plan`) and applied by a wrapper around the unchanged model classes.
See docs/tensor_parallel.md."""
