"""Building blocks shared by the model files: norm, rotary, linear, attention, MLP, MoE."""
