"""Kept for nodes configured by an earlier version: their rendered Prolog and Epilog run
``python -m slurm_plugin.coscheduler.hooks`` until ``malleable install-slurm-hooks`` renders
them again (docs/install.md, "Upgrade"). The code is in ``slurm_plugin.node``, ``.daemon``,
``.hooks``, ``.commands`` and ``slurm_plugin.containers``."""
