"""An earlier version's hook path (see this package's docstring): runs the hooks' one main."""
import sys

from slurm_plugin.hooks.job_hooks import main

if __name__ == "__main__":
    sys.exit(main())
