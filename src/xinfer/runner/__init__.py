"""Model execution: input preparation, the forward context, CUDA graphs and sampling."""
