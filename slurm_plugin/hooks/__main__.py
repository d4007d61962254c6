"""``python -m slurm_plugin.hooks prolog|epilog|step-start ...``: the path the rendered Prolog,
Epilog and the SPANK plugin run, which stays the same whichever module holds the hooks."""
import sys

from slurm_plugin.hooks.job_hooks import main

sys.exit(main())
