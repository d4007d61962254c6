"""Which native library this TensorFlow got, and whether parking works with it: pools of 2,
intra 1 and inter 1 active, a matmul, then both back to 2."""
import json

import malleable_tf

malleable_tf.init(max_threads=2, follow=False)
import tensorflow as tf  # noqa: E402

rt = malleable_tf.runtime()
lib = rt.pools.lib
malleable_tf.set_threads(intra=1, inter=1)
parked = [lib.mtf_parked(0), lib.mtf_parked(1)]
width = lib.mtf_split_width()
x = tf.ones((256, 256))
total = float(tf.reduce_sum(tf.matmul(x, x)).numpy())
malleable_tf.set_threads(intra=2, inter=2)
print("RESULT " + json.dumps({
    "tensorflow": tf.__version__, "parking_only": rt.pools.native.parking_only,
    "library": rt.pools.native.path.name, "parked_at_1": parked, "split_width_at_1": width,
    "parked_at_2": [lib.mtf_parked(0), lib.mtf_parked(1)], "sum": total}), flush=True)
