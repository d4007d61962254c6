"""What the root co-scheduler agent and the malleable ranks of a job share: their protocol, and
the one function that runs external commands (``malleable_protocol.runner``).

Standard library only: the agent (``slurm_plugin``, root), the launcher and ``malleable_tf``
(inside the user's job) all import it, and it imports none of them.

Who owns which file (``RunLayout``, under the run folder, default ``/run/malleable``):

- ``jobs/job_<id>/rank_<r>.<step>.json``: each rank's ``RankStatus``, written by the rank (the
  step, ``step_0`` or ``step_batch``, tells apart the ranks of concurrent sruns). The folder is
  made by the Prolog (root) and given to the job's user; root reads the records without following
  links, with a size and depth bound, and believes them only for pids in the job's cgroup.
- ``targets/job_<id>.<node>.json``: the ``Target`` of the job's ranks on one node, written by root
  in a folder only root can write; ranks read it with a size bound.

``rank_share`` is the one split of a node's cores among the ranks on it: the agent computes each
rank's thread target with it, and each rank takes its share of its allowance with it.
"""
from .cpulist import format_cpu_list, parse_cpu_list
from .layout import RunLayout, check_job_id, check_node_name, step_folder
from .records import (MAX_RECORD_BYTES, ProtocolError, RankStatus, ResizeEvent, Target,
                      decode_json_bounded, is_reload_signal)
from .share import rank_share, threads_per_rank

__all__ = ["format_cpu_list", "parse_cpu_list", "RunLayout", "check_job_id", "check_node_name",
           "step_folder",
           "MAX_RECORD_BYTES", "ProtocolError", "RankStatus", "ResizeEvent", "Target",
           "decode_json_bounded", "is_reload_signal", "rank_share", "threads_per_rank"]
