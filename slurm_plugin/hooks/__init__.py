"""What Slurm runs on a node, and what installs it: ``job_hooks`` (Prolog, Epilog and the step
start: ``python -m slurm_plugin.hooks prolog|epilog|step-start``), ``job_folder`` (the job's
status folder, made for its user and removed within a budget), ``jobfs`` (the run folder's own
tmpfs), ``install`` (``malleable install-slurm-hooks``: agent.json, the hooks, job_submit.lua and
the SPANK plugin's line, rendered from ``templates/``), ``spank/`` (the SPANK plugin in C, and
its build)."""
