"""A script that calls malleable_tf.init() and malleable_tf.horovod.init() itself, run through
``python -m malleable_tf.run`` (under mpirun): both calls join the runner's init, the Horovod
one still initializes Horovod, and a call asking for another pool size is refused."""
import json

import malleable_tf
import malleable_tf.horovod as mh

out = {}
s = malleable_tf.init()
out["plain"] = [s.intra_pool, s.intra_active]
s = mh.init(max_threads=s.intra_pool)
import horovod.tensorflow as hvd  # noqa: E402

out["horovod"] = [s.intra_pool, hvd.is_initialized(), hvd.rank(), hvd.size()]
try:
    malleable_tf.init(max_threads=s.intra_pool + 1)
    out["conflict"] = None
except malleable_tf.MalleableError as exc:
    out["conflict"] = str(exc)
import tensorflow as tf  # noqa: E402

out["sum"] = float(tf.reduce_sum(tf.matmul(tf.ones((4, 4)), tf.ones((4, 4)))))
out["intra"] = tf.config.threading.get_intra_op_parallelism_threads()
print("RESULT " + json.dumps(out), flush=True)
