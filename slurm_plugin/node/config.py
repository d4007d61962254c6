"""The agent's settings for one node, shared by the agent, the Prolog and the Epilog."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Mapping

from malleable_protocol import RunLayout, check_node_name
from malleable_protocol.errors import FixableError

from malleable_policy.model import Policy, SiteLimits

_PATHS = ("run_dir", "state_dir", "feed_dir", "cgroup_mount", "slurm_conf", "watcher_dir",
          "munge_socket")
NODE_PATTERN = "%n"        # in feed_dir: the node's name (several slurmd on one host)


@dataclass(frozen=True)
class AgentConfig:
    node: str
    policy: Policy = Policy.LEND_IDLE
    run_dir: Path = Path("/run/malleable")            # the protocol's folders (RunLayout)
    state_dir: Path = Path("/run/malleable/agent")    # root only: lock, pid, ledger, events
    # The node's feed: a local folder the feed link fills (``feed_link_hosts``), else the
    # watcher's own folder (one host) or one every node mounts. "%n": the node's name.
    feed_dir: Path = Path("/run/malleable/feed")
    cgroup_mount: Path | None = None  # None: CgroupMountpoint of cgroup.conf, else /sys/fs/cgroup
    slurm_conf: Path | None = None    # None: $SLURM_CONF, else Slurm's default (/etc/slurm)
    interval_s: float = 0.5       # a reconcile cycle at least this often
    feed_check_s: float = 0.05    # how often the loop turns (step starts, wakes); no I/O
    # How the agent learns of feed changes (feed/notify.py): "auto" from the feed folder's file
    # system, "local" (inotify), "shared" (the watcher's wake datagrams, and a look at the feed
    # files at most every feed_refresh_s).
    feed_mode: str = "auto"
    feed_refresh_s: float = 10.0
    wake_port: int = 0            # shared: the UDP port for wakes (0: any free one, registered)
    shrink_wait_s: float = 0.5    # how long a shrink waits for ranks to park before narrowing
    prolog_lock_timeout_s: float = 3.0    # a cycle holds the lock for ms: longer is a hang
    # The CPU time root may spend in one cycle on one user's input (his jobs' records and the
    # cgroup folders below them); past it his job is held to its allocation that cycle. A clean
    # job costs 0.3 ms on this project's machines: raise it only on slow or emulated nodes.
    input_cpu_budget_ms: float = 20.0
    max_cpus: int | None = None   # the site's limit on a job's cores per node (max=node too)
    # Cores above their allocations one user's jobs may hold on a node together (so one job
    # too), whatever he asks (cpus=, min=, max=) or claims (steps/s, weight=); None: no
    # limit, 0: no lending. 8: a lone job
    # still takes every idle core of a small node; on a large one a single user's word wins at
    # most 8 (sites whose jobs ask for a share of their cores and grow, raise it).
    max_borrowed_cpus: int | None = 8
    # The largest weight= (lend-idle) that counts for a job: per Slurm partition, else
    # max_weight. The user's weight= is only a wish within what the site allows (1: ignored).
    max_weight: int = 1
    partition_max_weight: Mapping[str, int] = field(default_factory=dict)
    # The site's kill switch (``switch.py``): false holds every job to its allocation.
    enabled: bool = True
    # The feed link (feed/link.py): the hosts whose watcher the agent connects to, in order
    # (the controller's, then its backups'); empty: no link (feed_dir is the watcher's folder).
    feed_link_hosts: tuple[str, ...] = ()
    feed_link_port: int = 6826
    # "munge" (the site's munged proves both ends are root), or "key:PATH" (a key file only
    # root reads, the same on every host).
    feed_link_auth: str = "munge"
    munge_socket: Path | None = None   # None: munge's default
    feed_link_sync_s: float = 5.0      # ``agent --once``: how long it waits for the feed
    # The watcher's own folder, on its host (the events slurmctld's hooks append to, what the
    # nodes send back); None: feed_dir.
    watcher_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.feed_mode not in ("auto", "local", "shared"):
            raise ValueError(f"feed_mode must be auto, local or shared, not {self.feed_mode!r}")
        if isinstance(self.wake_port, bool) or not isinstance(self.wake_port, int) or \
                not 0 <= self.wake_port < 65536:
            raise ValueError(f"wake_port must be a port (0: any), not {self.wake_port!r}")
        if isinstance(self.input_cpu_budget_ms, bool) or \
                not isinstance(self.input_cpu_budget_ms, (int, float)) or \
                not 1 <= self.input_cpu_budget_ms <= 1000:
            raise ValueError("input_cpu_budget_ms must be 1 to 1000, not "
                             f"{self.input_cpu_budget_ms!r}")
        if not 0 < self.feed_refresh_s <= 3600:
            raise ValueError(f"feed_refresh_s must be in (0, 3600], not {self.feed_refresh_s!r}")
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled must be true or false, not {self.enabled!r}")
        if not isinstance(self.feed_link_hosts, tuple) or not all(
                isinstance(h, str) and h and len(h) < 256 for h in self.feed_link_hosts):
            raise ValueError("feed_link_hosts must be a list of host names")
        if isinstance(self.feed_link_port, bool) or not isinstance(self.feed_link_port, int) \
                or not 0 < self.feed_link_port < 65536:
            raise ValueError(f"feed_link_port must be a port, not {self.feed_link_port!r}")
        if self.feed_link_auth != "munge" and not (
                isinstance(self.feed_link_auth, str) and self.feed_link_auth.startswith("key:/")):
            raise ValueError("feed_link_auth must be munge or key:/absolute/path, not "
                             f"{self.feed_link_auth!r}")

        def bad_weight(w: object) -> bool:
            return isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= 100
        b = self.max_borrowed_cpus
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ValueError(f"max_borrowed_cpus must be a whole number >= 0 or null, not {b!r}")
        if bad_weight(self.max_weight):
            raise ValueError(f"max_weight must be 1 to 100, not {self.max_weight!r}")
        if not isinstance(self.partition_max_weight, Mapping) or any(
                not isinstance(k, str) or bad_weight(v)
                for k, v in self.partition_max_weight.items()):
            raise ValueError("partition_max_weight maps partition names to weights 1 to 100")

    @property
    def limits(self) -> SiteLimits:
        """What the policy bounds the jobs' own words with (``NodeSnapshot.limits``)."""
        return SiteLimits(max_borrowed_cpus=self.max_borrowed_cpus, max_weight=self.max_weight,
                          partition_max_weight=dict(self.partition_max_weight))

    @classmethod
    def under(cls, base: Path, *, node: str = "(set by SLURMD_NODENAME or --node)",
              policy: Policy = Policy.LEND_IDLE, slurm_conf: Path | None = None) -> "AgentConfig":
        """Every folder below ``base`` (a site's /run/malleable, a local cluster's folder)."""
        base = Path(base)
        return cls(node=node, policy=policy, run_dir=base / "malleable",
                   state_dir=base / "agent", feed_dir=base / "feed", slurm_conf=slurm_conf)

    @property
    def watcher_feed_dir(self) -> Path:
        """The watcher's folder: where slurmctld's hooks append their events (its host's)."""
        return self.watcher_dir or self.feed_dir

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    @property
    def lock_file(self) -> Path:
        return self.state_dir / f"agent-{self.node}.lock"

    @property
    def switch_file(self) -> Path:
        """Thrown by ``malleable disable`` (``switch.py``)."""
        return self.state_dir / f"disabled-{self.node}"

    @property
    def quiet_file(self) -> Path:
        """Present while the node is quiet (``quiet.py``): the Prolog's shell reads it."""
        return self.state_dir / f"quiet-{self.node}"

    @property
    def loud_file(self) -> Path:
        """When the node stopped being quiet (``quiet.py``)."""
        return self.state_dir / f"loud-{self.node}"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"agent-{self.node}.pid"

    @property
    def step_socket(self) -> Path:
        """The agent's step-start socket (``step_socket``), root's like the folder it is in."""
        return self.state_dir / f"agent-{self.node}.sock"

    @property
    def event_log(self) -> Path:
        return self.state_dir / f"events-{self.node}.jsonl"

    def to_json(self) -> str:
        d = asdict(self)
        d["policy"] = self.policy.value
        for k in _PATHS:
            d[k] = None if d[k] is None else str(d[k])
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, **overrides) -> "AgentConfig":
        d = {**json.loads(text), **overrides}
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown agent settings: {', '.join(sorted(unknown))}")
        d["policy"] = Policy(d["policy"]) if not isinstance(d.get("policy"), Policy) \
            else d["policy"]
        for k in _PATHS:
            if d.get(k) is not None:
                d[k] = Path(d[k])
        if isinstance(d.get("feed_link_hosts"), list):
            d["feed_link_hosts"] = tuple(d["feed_link_hosts"])
        if NODE_PATTERN in str(d.get("feed_dir", "")) and _is_node_name(d.get("node")):
            d["feed_dir"] = Path(str(d["feed_dir"]).replace(NODE_PATTERN, d["node"]))
        return cls(**d)


def _is_node_name(name: object) -> bool:
    """False for the placeholder of a config loaded without its node (the watcher's)."""
    try:
        check_node_name(name)
    except ValueError:
        return False
    return True


class AgentConfigError(FixableError):
    """agent.json cannot be read, or says something wrong: which file, and what."""


def load_agent_config(path: str | Path, **overrides: object) -> AgentConfig:
    """agent.json (``overrides`` win: a command's --node, the node slurmd names in a hook), the
    one loader for the agent, the hooks and the commands."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AgentConfigError(
            f"cannot read the agent's config {path}: {exc.strerror or exc} (render it with "
            "`malleable install-slurm-hooks DIR`, or give --config)") from None
    try:
        return AgentConfig.from_json(text, **overrides)
    except KeyError as exc:
        raise AgentConfigError(f"bad agent config {path}: missing setting {exc.args[0]!r}") \
            from None
    except (ValueError, TypeError) as exc:   # not JSON, a bad or unknown setting
        raise AgentConfigError(f"bad agent config {path}: {exc}") from None
