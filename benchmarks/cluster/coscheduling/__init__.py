"""A reference workload of TensorFlow jobs per regime on the local cluster."""
