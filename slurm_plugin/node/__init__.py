"""The node's cycle, as a library: what the agent (``slurm_plugin.daemon``) runs every half
second and the hooks (``slurm_plugin.hooks``) run once under the node's lock.

- ``config``: the node's settings (agent.json) and the ``SiteLimits`` they give the policy;
- ``observe``: the node as it is (cgroups, the feed, the ledger, the ranks' records) into a
  ``NodeSnapshot``; ``ranks`` and ``procs`` read the ranks' records and processes safely;
- ``executor``: a ``Plan`` carried out in an order that never gives a core to two jobs, through
  ``cgroup_actuator``;
- ``reconciler``: one cycle (observe, decide, save the ledger, close gates, act, publish gates,
  account), crash-only; ``wiring`` builds it for this node;
- ``ledger``, ``core_usage``, ``accounting``: root's state across cycles, and the core-seconds
  each job borrowed and lent; ``events``: the capped event logs;
- ``step_gate``, ``safety``: the step-start gate the SPANK plugin reads, and the checks the hooks
  and the agent share before a step or a job starts.

The policy itself is ``malleable_policy`` (pure); this package does the node's I/O around it.
"""
