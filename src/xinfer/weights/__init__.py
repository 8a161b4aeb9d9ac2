"""Weight loading: checkpoint readers, the checkpoint-name → parameter mapping, dummy weights."""
