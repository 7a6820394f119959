"""ddpcheck: find PyTorch multi-GPU pitfalls before the job starts."""

__version__ = "0.2.0"
