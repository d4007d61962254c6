"""The agent's settings for one node, shared by the agent, the Prolog and the Epilog."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .model import Policy


@dataclass(frozen=True)
class AgentConfig:
    node: str
    policy: Policy = Policy.LEND_IDLE
    slurm_conf: Path | None = None
    status_base: Path = Path("/run/malleable/status")    # ranks' status records, per job
    state_dir: Path = Path("/run/malleable")             # lock, pid and event log
    cgroup_mount: Path = Path("/sys/fs/cgroup")
    interval_s: float = 0.5
    shrink_wait_s: float = 0.5    # how long a shrink waits for ranks to park before narrowing

    @property
    def lock_file(self) -> Path:
        return self.state_dir / f"agent-{self.node}.lock"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"agent-{self.node}.pid"

    @property
    def event_log(self) -> Path:
        return self.state_dir / f"events-{self.node}.jsonl"

    def to_json(self) -> str:
        d = asdict(self)
        d["policy"] = self.policy.value
        for k in ("slurm_conf", "status_base", "state_dir", "cgroup_mount"):
            d[k] = None if d[k] is None else str(d[k])
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, **overrides) -> "AgentConfig":
        d = {**json.loads(text), **overrides}
        d["policy"] = Policy(d["policy"])
        for k in ("status_base", "state_dir", "cgroup_mount"):
            d[k] = Path(d[k])
        d["slurm_conf"] = Path(d["slurm_conf"]) if d.get("slurm_conf") else None
        return cls(**d)
