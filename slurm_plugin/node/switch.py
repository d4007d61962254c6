"""The site's kill switch: malleability off on a node, every job held to exactly its Slurm
allocation from the next cycle on, whatever it asks, and nothing lent.

Two ways to throw it, both root's: the setting ``"enabled": false`` in agent.json (for
configuration management: every node, for good), and ``malleable disable`` (at once, on the
node it runs on, with a reason; ``malleable enable`` undoes it), which leaves a file in the
node's state folder (root's alone) and wakes the agent. The agent and every hook read it at each
cycle: the cycle then decides with ``Policy.STATIC``, so grown jobs are shrunk back (their ranks
told first, as in any shrink), lenders get their cores back, and step starts find every job
gated. A file that cannot be read counts as thrown: off is always safe.
"""
from __future__ import annotations

import os

from slurm_plugin.node.config import AgentConfig

MAX_REASON = 200


def switched_off(config: AgentConfig) -> str | None:
    """Why malleability is off on this node, or None when it is on."""
    if not config.enabled:
        return "malleability is switched off in agent.json (enabled: false)"
    path = config.switch_file
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"malleability is switched off ({path} cannot be read: {exc.strerror})"
    try:
        reason = os.read(fd, MAX_REASON).decode(errors="replace").strip()
    except OSError as exc:
        reason = f"unreadable: {exc.strerror}"
    finally:
        os.close(fd)
    return "malleability is switched off by 'malleable disable'" + \
        (f": {reason}" if reason else "")


def switch_off(config: AgentConfig, reason: str) -> None:
    """Throw the switch on this node (atomically: a hook never reads half a file)."""
    config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = config.switch_file.with_name(f".{config.switch_file.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, reason.encode()[:MAX_REASON] + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, config.switch_file)


def switch_on(config: AgentConfig) -> bool:
    """Undo ``switch_off``; False when it was not thrown this way."""
    try:
        os.unlink(config.switch_file)
        return True
    except FileNotFoundError:
        return False
