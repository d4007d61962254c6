"""The cluster: real Slurm, its controller's load, the simulator checked against it."""
