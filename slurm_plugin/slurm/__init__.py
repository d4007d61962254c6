"""The Slurm client: typed jobs and nodes, parsers of real command output, and backends."""
from slurm_plugin.slurm.client import (CliSlurmClient, JobAccounting, SignalTarget, SlurmClient, SlurmClientError, UnknownJob,
                     make_client, validate_job_id)
from malleable_protocol.hostlist import expand_hostlist
from slurm_plugin.slurm.model import Job, JobState, Node

__all__ = ["CliSlurmClient", "JobAccounting", "SignalTarget", "SlurmClient", "SlurmClientError", "UnknownJob",
           "make_client", "validate_job_id", "expand_hostlist", "Job", "JobState", "Node"]
