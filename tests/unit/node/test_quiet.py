"""The quiet node's two files (node/quiet.py): what breaks the quiet, and the gate that keeps
every core unlent until the watcher has published a poll made after the quiet ended."""
from __future__ import annotations

from pathlib import Path

from malleable_policy.model import JobView, MalleableSpec, NodeSnapshot
from slurm_plugin.node.ledger import Ledger
from slurm_plugin.node.quiet import QUIET_SKEW_S, break_quiet, gate, make_quiet, quiet_possible

S = frozenset


def test_only_a_node_with_nothing_malleable_starting_or_unverified_may_be_quiet():
    rigid = JobView(5, 1000, "u", S({0}), S({0}))
    malleable = JobView(6, 1000, "u", S({1}), S({1}), spec=MalleableSpec(1, None))
    snap = NodeSnapshot("n1", S({0, 1}), (rigid,))
    assert quiet_possible(snap, Ledger(), feed_malleable=False)
    assert not quiet_possible(snap, Ledger(), feed_malleable=True)
    assert not quiet_possible(NodeSnapshot("n1", S({0, 1}), (rigid, malleable)), Ledger(),
                              feed_malleable=False)
    assert not quiet_possible(snap, Ledger(starting={7: 1.0}), feed_malleable=False)
    assert not quiet_possible(NodeSnapshot("n1", S({0, 1}), (rigid,), problems=("x",)),
                              Ledger(), feed_malleable=False)


def test_the_gate_opens_on_a_poll_made_after_the_quiet_ended(tmp_path: Path):
    quiet, loud = tmp_path / "quiet-n1", tmp_path / "loud-n1"
    told = []
    tell = lambda: told.append(1)     # noqa: E731 - the watcher, told to poll
    assert not break_quiet(quiet, loud, 100.0, tell) and not loud.exists() and not told
    assert gate(loud, lambda: None, 100.0, tell) is None          # never quiet: open
    make_quiet(quiet, loud)
    assert quiet.exists()
    assert break_quiet(quiet, loud, 100.0, tell)
    assert not quiet.exists() and loud.exists() and told == [1]
    polled: list[float | None] = [None]
    assert gate(loud, lambda: polled[0], 100.5, tell) is not None  # no poll yet
    polled[0] = 100.5                  # a poll within the margin: not proof enough
    assert gate(loud, lambda: polled[0], 100.9, tell) is not None and told == [1]
    assert gate(loud, lambda: polled[0], 100.0 + QUIET_SKEW_S, tell) is not None
    assert told == [1, 1]              # told once more, after the margin
    assert gate(loud, lambda: polled[0], 102.0, tell) is not None and told == [1, 1]
    polled[0] = 100.0 + QUIET_SKEW_S
    assert gate(loud, lambda: polled[0], 102.0, tell) is None and not loud.exists()
    assert gate(loud, lambda: None, 103.0, tell) is None            # open until quiet again


def test_the_gate_tells_the_watcher_again_until_a_poll_after_the_margin_comes(tmp_path: Path):
    """Seen live (two VMs, the watcher's clock 0.12 s behind the node's): the one poll the
    tell after the margin brought began, by the watcher's clock, just before the margin, and
    the node never lent again. Now it tells again, less and less often, until one does."""
    quiet, loud = tmp_path / "quiet-n1", tmp_path / "loud-n1"
    quiet.write_text("")
    told: list[float] = []
    now = [100.0]
    break_quiet(quiet, loud, now[0], lambda: told.append(now[0]))
    polled = 100.0 + QUIET_SKEW_S - 0.12          # the answer to each tell: a clock behind
    for t in [100.0 + i * 0.5 for i in range(1, 60)]:   # a cycle every 0.5 s for 30 s
        now[0] = t
        assert gate(loud, lambda: polled, t, lambda: told.append(now[0])) is not None
    assert told[:4] == [100.0, 101.0, 103.0, 106.0]    # at the quiet's end, then 1, 3, 6 s
    assert len(told) == 6                                 # ... 12, 24 s: 6 in 30 s, not 60
    assert gate(loud, lambda: 101.0, 130.0, lambda: None) is None    # a poll after the margin


def test_an_unreadable_loud_file_keeps_the_gate_shut_until_any_poll(tmp_path: Path):
    loud = tmp_path / "loud-n1"
    loud.write_text("garbage\n")
    told = []
    assert gate(loud, lambda: None, 5.0, lambda: told.append(1)) is not None and told == [1]
    assert gate(loud, lambda: 2.0, 5.0, lambda: None) is None


def test_quiet_again_forgets_the_gate(tmp_path: Path):
    quiet, loud = tmp_path / "quiet-n1", tmp_path / "loud-n1"
    quiet.write_text("")
    break_quiet(quiet, loud, 10.0, lambda: None)
    make_quiet(quiet, loud)
    assert quiet.exists() and not loud.exists()
    assert gate(loud, lambda: None, 11.0, lambda: None) is None
