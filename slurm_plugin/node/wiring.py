"""The node's composition root: the one place where a node's settings, its discovered Slurm
cgroup layout and CPU numbering, its cpuset actuator and its reconciler are made, for the agent (``agent.py``)
and the hooks alike (``hooks.py``, ``safety.py``)."""
from __future__ import annotations

from pathlib import Path

from slurm_plugin.cgroups import SlurmCgroupLayout, discover_layout
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.node.cgroup_actuator import CpusetActuator, WriteHook
from slurm_plugin.node.config import AgentConfig, load_agent_config
from slurm_plugin.node.executor import PlanExecutor
from slurm_plugin.node.ledger import LedgerFile
from slurm_plugin.node.observe import NodeObserver
from slurm_plugin.node.ranks import RankReader
from slurm_plugin.node.reconciler import Reconciler
from slurm_plugin.node.step_gate import StepGate
from slurm_plugin.settings import root_settings
from slurm_plugin.topology import CpuNumbering, TopologyUnknown, node_numbering


def load_config(path: Path) -> AgentConfig:
    """agent.json, for the node slurmd names (SLURMD_NODENAME) when it runs a hook."""
    node = root_settings().slurmd_node
    return load_agent_config(path, **({"node": node} if node else {}))


def node_layout(config: AgentConfig) -> SlurmCgroupLayout:
    """The node's Slurm cgroup layout, discovered (``LayoutUnknown`` when it cannot be)."""
    return discover_layout(config.node, slurm_conf=config.slurm_conf, mount=config.cgroup_mount)


def make_actuator(config: AgentConfig, layout: SlurmCgroupLayout | None = None, *,
                  before_write: WriteHook | None = None) -> CpusetActuator:
    """``before_write``: a test's hook before each cpuset write (tests/programs); None here."""
    return CpusetActuator(layout or node_layout(config), before_write=before_write)


def cpu_numbering() -> tuple[CpuNumbering | None, str | None]:
    """This node's CPU numbering (sysfs), or why it cannot be established."""
    try:
        return node_numbering(), None
    except TopologyUnknown as exc:
        return None, str(exc)


def make_reconciler(config: AgentConfig, layout: SlurmCgroupLayout | None = None, *,
                    feed_refresh_s: float | None = None,
                    before_write: WriteHook | None = None,
                    numbering: CpuNumbering | None = None) -> Reconciler:
    """The node's reconciler; ``layout`` None: discovered from the node. Its observer and
    executor share one budgeted reader of the ranks' records (``RankReader``), renewed by the
    reconciler each cycle. ``feed_refresh_s``: the feed's files are looked at no more often
    (the agent's loop, told of changes otherwise: notify.py); None: at every read.
    ``numbering``: how Slurm's CPU ids name this node's CPUs; None: read from the node."""
    actuator = make_actuator(config, layout, before_write=before_write)
    store = FeedStore(config.feed_dir, refresh_s=feed_refresh_s)
    reader = RankReader(max_cpu_s=config.input_cpu_budget_ms / 1000)
    refusal = None
    if numbering is None:
        numbering, refusal = cpu_numbering()
    observer = NodeObserver(config.node, config.layout, store, actuator,
                            max_cpus=config.max_cpus, limits=config.limits, read_ranks=reader,
                            numbering=numbering, refusal=refusal)
    executor = PlanExecutor(config.node, config.layout, actuator,
                            shrink_wait_s=config.shrink_wait_s, read_ranks=reader)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    return Reconciler(config, observer, executor, LedgerFile(config.state_dir, config.node),
                      store, rank_reader=reader, gate=StepGate(config.state_dir, config.node))
