"""Exits in the way named by argv[1] while threads are parked: must not hang."""
import sys
import threading

import malleable_tf

malleable_tf.init(max_threads=4)
import tensorflow as tf  # noqa: E402

malleable_tf.set_threads(intra=1, inter=1)
assert malleable_tf.runtime().pools.lib.mtf_parked(0) == 3
x = tf.random.normal((256, 256))
tf.matmul(x, x).numpy()
how = sys.argv[1]
print("READY", flush=True)
if how == "normal":
    pass
elif how == "exception":
    raise RuntimeError("deliberate")
elif how == "sys_exit_thread":
    def bye():
        tf.matmul(x, x).numpy()
    t = threading.Thread(target=bye)
    t.start()
    t.join()
    sys.exit(3)
