"""malleable_runtime: the part of the user side every framework shares.

In a training process it follows the CPU allowance (affinity mask, cpuset cgroup, CPU quota) and
the co-scheduler's target, takes control signals, counts training steps and writes the rank's
status record (``runtime.Runtime``, started by ``session.start_runtime``); it decides how many
threads run and in which order against pinning, and a framework's adapter (``adapter``:
``ThreadPools`` and ``Wakeups``) applies the counts. ``malleable-srun`` (``srun``) sets each
rank's settings under srun. It imports no framework: TensorFlow's adapter and API are
``malleable_tf``, whose ``init()`` users call; a second framework plugs in beside it.
"""
