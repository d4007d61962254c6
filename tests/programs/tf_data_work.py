"""A CPU-bound tf.data map function shared by the tf.data test programs. Import it after
``malleable_tf.init()`` (it imports TensorFlow)."""
import tensorflow as tf


def heavy(i):
    x = tf.random.stateless_normal((160, 160), seed=tf.stack([i, 0]))
    for _ in range(6):
        x = tf.tanh(tf.matmul(x, x) / 160.0)
    return tf.reduce_sum(x)
