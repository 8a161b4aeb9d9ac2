"""Model definitions, one file per HF `model_type`, built from the blocks in `xinfer.layers`."""
