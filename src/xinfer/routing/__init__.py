"""Routing sources at the MoE router, for benchmarks and traffic studies: the router's own
top-k (the default), a parametric model of real routing, or the replay of a recorded trace,
plus the recording of every layer's routed ids to a file. Selected only by explicit options
(`RoutingConfig`); everything runs on the device, inside CUDA graphs."""
