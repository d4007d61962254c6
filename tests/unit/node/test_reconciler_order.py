"""The order of one reconcile cycle, pinned: the ledger saved (with the step's fence) before any
fence file is removed and before anything moves; the gates of the jobs to act on closed before
the actions; the gates published after them; the usage saved last, then the feed's offers and
report. A crash between any two of these leaves a state the next cycle (or the SPANK plugin)
reads safely: this is what makes the loop crash-only.

The ledger, the gate and the feed are the real ones, on tmp_path, each wrapped to record its
calls; the observer and the executor are stand-ins that give one malleable job room to grow."""
from __future__ import annotations

import json

from malleable_policy.model import (JobView, NodeSnapshot, Outcome, OutcomeStatus, Plan,
                                    Policy)
from malleable_policy.request import MalleableSpec
from slurm_plugin.feed.store import FeedStore
from slurm_plugin.hooks.install import prepare_node_folders
from slurm_plugin.node.config import AgentConfig
from slurm_plugin.node.ledger import Fence, LedgerFile
from slurm_plugin.node.reconciler import Hold, Reconciler
from slurm_plugin.node.step_gate import StepGate

NODE = "n1"
CPUS = frozenset(range(4))


class Journal(list):
    def names(self) -> list[str]:
        return [entry[0] for entry in self]


class RecordingLedger(LedgerFile):
    def __init__(self, journal: Journal, *args):
        super().__init__(*args)
        self.journal = journal

    def load(self):
        self.journal.append(("ledger.load",))
        return super().load()

    def save(self, ledger) -> None:
        self.journal.append(("ledger.save", dict(ledger.fences), dict(ledger.usage)))
        super().save(ledger)


class RecordingGate(StepGate):
    journal: Journal

    def read_fences(self):
        names, fences = super().read_fences()
        self.journal.append(("gate.read_fences", tuple(names)))
        return names, fences

    def remove_fences(self, names) -> None:
        names = list(names)
        self.journal.append(("gate.remove_fences", tuple(names)))
        super().remove_fences(names)

    def close(self, job_ids) -> None:
        job_ids = sorted(job_ids)
        self.journal.append(("gate.close", tuple(job_ids)))
        super().close(job_ids)

    def publish(self, gated: set[int]) -> None:
        self.journal.append(("gate.publish", tuple(sorted(gated))))
        super().publish(gated)


class RecordingStore(FeedStore):
    journal: Journal

    def write_offers(self, offers) -> None:
        self.journal.append(("store.write_offers",))
        super().write_offers(offers)

    def write_report(self, report) -> None:
        self.journal.append(("store.write_report",))
        super().write_report(report)


class OneGrowingJob:
    """The observer and the executor: job 7 holds core 0 of 4 and may grow to the node."""
    refusal = None      # the node's CPU numbering is never in question here
    numbering = None    # Slurm's CPU ids are Linux's
    site_switched_off = None   # the site never switched malleability off here
    feed_malleable = True      # its feed lists a malleable job (the node is never quiet)

    def __init__(self, journal: Journal):
        self.journal = journal

    def observe(self, ledger) -> NodeSnapshot:
        self.journal.append(("observe", dict(ledger.fences)))
        job = JobView(job_id=7, uid=1000, user="u", allocation=frozenset({0}),
                      current=frozenset({0}), spec=MalleableSpec(1, None))
        return NodeSnapshot(NODE, CPUS, (job,))

    def execute(self, plan: Plan, snapshot: NodeSnapshot) -> list[Outcome]:
        self.journal.append(("execute", tuple(a.job_id for a in plan.actions)))
        return [Outcome(a, OutcomeStatus.APPLIED) for a in plan.actions]


def make(tmp_path):
    journal = Journal()
    config = AgentConfig.under(tmp_path, node=NODE, policy=Policy.LEND_IDLE)
    prepare_node_folders(config)
    gate = RecordingGate(config.state_dir, NODE)
    gate.journal = journal
    gate.prepare()
    store = RecordingStore(config.feed_dir)
    store.journal = journal
    store.prepare()
    ledger = RecordingLedger(journal, config.state_dir, NODE)
    node = OneGrowingJob(journal)
    return journal, gate, Reconciler(config, node, node, ledger, store, gate=gate,
                                     wall=lambda: 1_700_000_000.0)


def test_one_cycle_runs_in_the_crash_only_order(tmp_path):
    journal, gate, rec = make(tmp_path)
    # A fence file the SPANK plugin wrote for a step of another job ("<pid> <since>").
    (gate.fences / "9.step_0").write_text("4321 1700000000.0\n")
    result = rec.cycle()
    assert result.failures == [], result.failures
    assert [a.job_id for a in result.plan.actions] == [7]
    # Offers are written only when they change (none here: a job of one node offers nothing).
    names = journal.names()
    last_save = len(names) - 1 - names[::-1].index("ledger.save")
    assert all(i > last_save for i, n in enumerate(names) if n == "store.write_offers")
    assert [n for n in names if n != "store.write_offers"] == [
        "ledger.load", "gate.read_fences", "observe",
        "ledger.save",             # the fences taken in are root's before their files go
        "gate.remove_fences",
        "gate.close",              # the jobs acted on go the slow way first...
        "execute",
        "gate.publish",            # ...and may have a gate again once their cores are written
        "ledger.save",             # the usage of the cycle, integrated to now
        "store.write_report"]
    by_name = {entry[0]: entry for entry in journal}
    assert by_name["gate.close"] == ("gate.close", (7,))
    assert by_name["execute"] == ("execute", (7,))
    assert by_name["gate.read_fences"] == ("gate.read_fences", ("9.step_0",))
    first_save, last_save = [e for e in journal if e[0] == "ledger.save"]
    assert (9, "step_0") in first_save[1]          # the fence is saved before its file goes
    assert first_save[2] == {} and set(last_save[2]) == {7}    # usage only after the actions
    assert list(gate.fences.iterdir()) == []


def test_a_fence_reaches_the_saved_ledger_before_its_file_is_removed(tmp_path):
    journal, gate, rec = make(tmp_path)
    rec.cycle(fences=[(7, Fence(step="step_1", stepd_pid=99, since=1_700_000_000.0))])
    save = journal.names().index("ledger.save")
    observe = journal.names().index("observe")
    assert (7, "step_1") in journal[observe][1] and (7, "step_1") in journal[save][1]
    assert save < journal.names().index("gate.remove_fences")


def test_a_corrupt_ledger_is_kept_aside_and_the_node_changes_nothing_until_removed(tmp_path):
    journal, gate, rec = make(tmp_path)
    (rec.ledger.folder / rec.ledger.name).write_bytes(b'{"fences": [')
    for _ in range(2):      # refused each cycle while the kept file is there
        journal.clear()
        result = rec.cycle()
        assert any("LedgerCorrupt" in e for e in result.errors), result.errors
        assert journal.names() == ["ledger.load"]     # nothing observed, closed or moved
    assert rec.ledger.kept_aside.read_bytes() == b'{"fences": ['
    rec.ledger.kept_aside.unlink()     # the admin has looked
    journal.clear()
    assert rec.cycle().errors == [] and "execute" in journal.names()


def test_a_node_whose_cpu_numbering_is_refused_holds_every_job_and_says_so_once(tmp_path):
    journal, gate, rec = make(tmp_path)
    rec.observer.refusal = "Slurm describes node n1 as 1 sockets x 4 cores x 1 threads, ..."
    for _ in range(2):
        result = rec.cycle()
        assert result.failures == [] and result.plan.actions == ()    # job 7 does not grow
        assert result.refusal == Hold("cpu-numbering", rec.observer.refusal)
    events = [json.loads(line) for line in rec.config.event_log.read_text().splitlines()]
    assert [e["event"] for e in events].count("cpu-numbering") == 1
    rec.observer.refusal = None          # the feed's layout mended: the policy runs again
    assert [a.job_id for a in rec.cycle().plan.actions] == [7]
