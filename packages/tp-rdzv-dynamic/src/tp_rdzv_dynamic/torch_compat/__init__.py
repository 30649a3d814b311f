"""PyTorch compatibility: torchrun's plugin and torch's own c10d state."""
