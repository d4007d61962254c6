"""The co-scheduler's pure core, shared by every place that decides cores: the node agent
(``slurm_plugin``), the container co-scheduler, the cluster's feed and the simulator
(``malleable_sim``).

- ``request``: the malleability request grammar (the ``--malleable`` option, the Comment forms),
  its one source; job_submit.lua's constants are rendered from it.
- ``model``: what a node's co-scheduler sees (``NodeSnapshot``, ``JobView``, ``RankView``) and
  what it decides (``Plan`` of ``Action`` s), with the executor's ``Outcome`` of each action.
- ``decide``: ``decide(snapshot, policy) -> Plan``. No I/O, no clock.

It imports the protocol (``malleable_protocol``) and the standard library only.
"""
