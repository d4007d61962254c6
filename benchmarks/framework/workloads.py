"""Workloads shared by the benchmarks: training steps of a small Keras CNN and of MobileNetV2
(3.5 M parameters, 96x96 images), a matmul-heavy function and an input-bound tf.data pipeline.

Import this only after TensorFlow's thread settings are made (plain or malleable_tf.init).
Each ``make(data_map)`` returns a step function; ``data_map(dataset, fn, **kw)`` maps a tf.data
stage (malleable_tf.data.map in a malleable process; None: ``dataset.map``).
"""
from __future__ import annotations


import tensorflow as tf

from benchmarks.common import steps_per_second  # noqa: F401 - the workers' measure, with the workloads


def _train_step(model, x, y):
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    return lambda: step().numpy()


def keras_cnn_step(data_map=None, batch: int = 64):
    tf.random.set_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    x = tf.random.normal((batch, 28, 28, 1), seed=1)
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=2)
    return _train_step(model, x, y)


def mobilenet_v2_step(data_map=None, batch: int = 16, size: int = 96):
    """MobileNetV2 (untrained: weights=None, nothing downloaded), 10 classes."""
    tf.random.set_seed(0)
    model = tf.keras.applications.MobileNetV2(input_shape=(size, size, 3), weights=None,
                                              classes=10, classifier_activation=None)
    x = tf.random.normal((batch, size, size, 3), seed=1)
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32, seed=2)
    return _train_step(model, x, y)


def matmul_step(data_map=None, size: int = 512, depth: int = 8):
    a = tf.random.normal((size, size), seed=3)

    @tf.function
    def step():
        x = a
        for _ in range(depth):
            x = tf.matmul(x, a) / float(size) ** 0.5
        return tf.reduce_sum(x)

    return lambda: step().numpy()


def tf_data_step(data_map=None, batch: int = 8, autotune: bool = True):
    """A batch from a pipeline whose map function is CPU-bound (AUTOTUNE parallelism).
    ``autotune=False``: without tf.data's autotuner (as ``malleable_tf.data.options()`` runs a
    malleable pipeline), for a plain pipeline compared with one."""
    def parse(i):
        x = tf.random.stateless_normal((128, 128), seed=tf.stack([i, 0]))
        for _ in range(4):
            x = tf.tanh(tf.matmul(x, x) / 128.0)
        return tf.reduce_mean(x, axis=0)

    source = tf.data.Dataset.range(2**62)
    if data_map is None:
        ds = source.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = data_map(source, parse, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch).prefetch(1)
    if not autotune:
        opts = tf.data.Options()
        opts.autotune.enabled = False
        ds = ds.with_options(opts)
    it = iter(ds)
    return lambda: next(it).numpy()


WORKLOADS = {"keras_cnn": keras_cnn_step, "mobilenet_v2": mobilenet_v2_step,
             "matmul": matmul_step, "tf_data": tf_data_step}
