"""The framework: TensorFlow in one process, resized (workers run as modules of their own)."""
