"""Triton kernels (`@triton.jit` code only); launched from `xinfer.kernels`."""
