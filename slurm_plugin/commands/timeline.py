"""``malleable timeline JOB [JOB ...] [--events FILE ...] [--png FILE] [--json FILE]``: each
node's cores per job over the jobs' lives, stacked, drawn from the agents' event logs
(``slurm_plugin.timeline``): what ``demo-timeline.png`` shows, for any job. The jobs that shared
those nodes meanwhile are drawn too: the top of each stack is the node's total.

The event logs are root's, one per node (``events-NODE.jsonl`` in the agent's state folder,
and the older ``.1``): by default this node's, from the agent's configuration; for a job on
several nodes, name each node's log (gathered, or on a shared folder). Samples go to ``--json``;
the picture needs matplotlib (``--png``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from malleable_protocol.safe_io import read_bounded
from slurm_plugin.commands.common import DEFAULT_AGENT_CONFIG, CliError, job_id_arg
from slurm_plugin.node.config import AgentConfigError, load_agent_config
from slurm_plugin.node.events import MAX_LOG_BYTES
from slurm_plugin.settings import RootSettings


def add_parser(sub: argparse._SubParsersAction, env: RootSettings) -> None:
    tl = sub.add_parser("timeline", help="each node's cores per job over time, from the agents' "
                                         "event logs")
    tl.add_argument("job_ids", nargs="+", type=job_id_arg, metavar="JOB")
    tl.add_argument("--events", nargs="+", type=Path, metavar="FILE",
                    help="agents' event logs (default: this node's, and its older .1)")
    tl.add_argument("--config", type=Path, default=Path(DEFAULT_AGENT_CONFIG),
                    help="the agent's configuration, for where this node's log is")
    tl.add_argument("--png", type=Path, help="draw the timeline here (needs matplotlib)")
    tl.add_argument("--json", type=Path, help="write the samples here")
    tl.add_argument("--cores", type=int, help="the nodes' cores: a dashed line at that height")
    tl.set_defaults(func=run)


def _default_logs(config: Path) -> list[Path]:
    try:
        log = load_agent_config(config).event_log
    except (AgentConfigError, OSError) as exc:
        raise CliError(f"no event log named and no agent configuration to find this node's "
                       f"({exc}): give --events FILE ...") from None
    return [p for p in (log.with_name(log.name + ".1"), log) if p.exists()]


def run(args: argparse.Namespace) -> int:
    from slurm_plugin.timeline import samples_from_events
    logs = args.events or _default_logs(args.config)
    lines: list[str] = []
    for path in logs:
        try:
            lines += read_bounded(path, 2 * MAX_LOG_BYTES).decode(errors="replace").splitlines()
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc}") from None
    samples = samples_from_events(lines, args.job_ids)
    if not samples:
        raise CliError(f"no resize or usage of job(s) {', '.join(map(str, args.job_ids))} in "
                       f"{', '.join(map(str, logs)) or 'no log'}")
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1) + "\n")
    if args.png:
        try:
            from slurm_plugin.timeline import plot_stacked
            jobs = sorted({s["job"] for s in samples}, key=lambda j: (j not in args.job_ids, j))
            asked = ", ".join(map(str, args.job_ids))
            plot_stacked(samples, {j: str(j) for j in jobs}, args.png,
                         cores_per_node=args.cores,
                         title=f"Cores per job per node, stacked (job {asked} and those beside "
                               f"it; seconds from the first change)")
        except ImportError:
            raise CliError("--png needs matplotlib (apt-get install python3-matplotlib)") from None
    nodes = sorted({s["node"] for s in samples})
    print(f"{len(samples)} samples on {', '.join(nodes)} over {max(s['t'] for s in samples):.0f} s"
          + (f"; {args.png}" if args.png else "") + (f"; {args.json}" if args.json else ""))
    return 0
