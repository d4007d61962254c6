"""Runtime decisions with the OS readers and the native library replaced by fakes.

What is checked here is the logic: caps, ordering of park and pin, change detection. The real
mechanism is tested on real TensorFlow in tests/integration/test_malleable_tf.py.
"""
import pytest

from malleable_tf import Action, MalleableError, NotInitialized
from malleable_runtime.runtime import Runtime


from ..fakes import World, fake_tf_adapter


def make(world, pool=4, local_rank=0, local_size=1, follow=True):
    rt = Runtime(*fake_tf_adapter(world.calls, pool), local_rank=local_rank,
                 local_size=local_size, follow=follow, read_affinity=lambda: world.mask,
                 cgroup=world, pin=world.pin)
    rt.set_threads(reason="init")
    return rt


def test_follows_affinity_and_orders_park_and_pin():
    w = World({0, 1, 2, 3})
    rt = make(w)
    assert rt.state().intra_active == 4
    w.calls.clear()
    w.mask = frozenset({0})           # shrink from outside
    assert rt.refresh_allowance()
    assert rt.state().intra_active == 1 and rt.state().share_cpus == {0}
    kinds = [c[0] for c in w.calls]
    assert kinds.index("park") < kinds.index("pin")   # threads drop before the CPU set narrows
    w.calls.clear()
    w.mask = frozenset({0, 1, 2})     # grow
    assert rt.refresh_allowance()
    kinds = [c[0] for c in w.calls]
    assert kinds.index("pin") < kinds.index("park")   # CPU set widens before threads wake
    assert rt.state().intra_active == 3


def test_own_pinning_is_not_an_outside_change():
    w = World({0, 1, 2, 3})
    rt = make(w, local_rank=1, local_size=2)
    assert rt.state().share_cpus == {2, 3}
    assert w.mask == {2, 3}           # pinned to the share
    assert not rt.refresh_allowance()  # reading back our own pinning changes nothing
    assert rt.state().allowed_cpus == {0, 1, 2, 3}


def test_cpuset_shrink_to_exactly_the_share_is_seen():
    w = World({0, 1, 2, 3})
    rt = make(w, local_rank=0, local_size=2)
    assert w.mask == {0, 1}
    w.cpuset_cpus = frozenset({0, 1})      # the kernel resets masks to the cpuset: equal to our pin
    assert rt.refresh_allowance()
    assert rt.state().share_cpus == {0} and rt.state().intra_active == 1


def test_quota_caps_threads():
    w = World({0, 1, 2, 3})
    rt = make(w)
    w.quota_cpus = 2.0
    assert rt.refresh_allowance()
    assert rt.state().intra_active == 2


def test_explicit_request_wins_within_allowance():
    w = World({0, 1, 2, 3})
    rt = make(w)
    rt.set_threads(intra=2)
    assert rt.state().intra_active == 2
    w.mask = frozenset({0})
    rt.refresh_allowance()
    assert rt.state().intra_active == 1
    w.mask = frozenset({0, 1, 2, 3})
    rt.refresh_allowance()
    assert rt.state().intra_active == 2   # the request, not the whole allowance


def test_bad_values_change_nothing():
    w = World({0, 1, 2, 3})
    rt = make(w)
    before = rt.state()
    for bad in [0, -1, 5, "2", 1.5, True]:
        with pytest.raises((ValueError, TypeError)):
            rt.set_threads(intra=bad)
    assert rt.state() == before


def test_signal_actions_step_within_bounds():
    w = World({0, 1})
    rt = make(w, pool=2)
    rt.handle(Action.INTRA_DOWN)
    rt.handle(Action.INTRA_DOWN)
    assert rt.state().intra_active == 1   # never below one
    rt.handle(Action.INTRA_UP)
    rt.handle(Action.INTRA_UP)
    assert rt.state().intra_active == 2   # never above the pool


def test_target_file_caps_the_allowance_and_bad_ones_change_nothing(tmp_path):
    from malleable_protocol import Target
    w = World({0, 1, 2, 3})
    rt = make(w)
    rt.target_path = tmp_path / "target.json"
    rt.target_path.write_bytes(Target(frozenset({0, 1, 2})).encode())
    rt.handle(Action.RELOAD)
    assert rt.state().intra_active == 3 and rt.state().share_cpus == {0, 1, 2}
    for bad in [b'{"cpus": ""}', b"[1]", b"not json", b'{"cpus": 3}', b"x" * 100000]:
        rt.target_path.write_bytes(bad)
        rt.handle(Action.RELOAD)
        assert rt.state().intra_active == 3
    rt.target_path.unlink()
    rt.target_path.symlink_to(tmp_path / "elsewhere.json")     # never followed
    (tmp_path / "elsewhere.json").write_bytes(Target(frozenset({0})).encode())
    rt.handle(Action.RELOAD)
    assert rt.state().intra_active == 3
    # A target disjoint from the allowance is stale: the allowance alone counts.
    rt.target_path.unlink()
    rt.target_path.write_bytes(Target(frozenset({9})).encode())
    rt.handle(Action.RELOAD)
    assert rt.state().intra_active == 4


@pytest.mark.parametrize("local_rank,threads", [(0, 2), (1, 1)])
def test_three_cores_two_ranks_each_rank_runs_the_threads_the_agent_counts(tmp_path, local_rank,
                                                                           threads):
    from malleable_protocol import Target, threads_per_rank
    w = World({0, 1, 2, 3})
    rt = make(w, local_rank=local_rank, local_size=2)
    rt.target_path = tmp_path / "target.json"
    rt.target_path.write_bytes(Target(frozenset({0, 1, 2})).encode())
    rt.handle(Action.RELOAD)
    assert rt.state().intra_active == threads == threads_per_rank({0, 1, 2}, 2)[local_rank]


def test_closed_runtime_refuses_and_ignores_signals():
    w = World({0, 1})
    rt = make(w, pool=2)
    rt.close()
    with pytest.raises(NotInitialized):
        rt.set_threads(1)
    rt.handle(Action.INTRA_DOWN)      # no error, no change
    assert ("shutdown",) in w.calls


def test_the_record_names_the_reload_signal_only_once_its_handler_is_in():
    """The agent sends a rank the signal its record names, and a real-time signal's default
    action ends the process: no record may name one before the handler is in."""
    import signal
    w = World({0, 1})
    rt = make(w, pool=2)
    installed = []

    def install(signo, code):
        installed.append(signo)
        return -22 if signo == signal.SIGUSR2 else 0      # EINVAL
    rt.pools.lib.mtf_install_signal = install   # the wake-ups share the native library
    assert rt.status_record().reload_signal is None
    with pytest.raises(MalleableError, match="SIGUSR2"):
        rt.install_signals({signal.SIGRTMIN + 3: Action.RELOAD, signal.SIGUSR2: Action.RELOAD})
    assert rt.status_record().reload_signal is None       # not every handler went in
    rt.install_signals({signal.SIGRTMIN + 3: Action.RELOAD, signal.SIGURG: Action.INTRA_UP})
    assert rt.status_record().reload_signal == signal.SIGRTMIN + 3
    rt.install_signals({signal.SIGURG: Action.INTRA_UP})   # nothing re-reads: the agent sends none
    assert rt.status_record().reload_signal is None


def test_status_record_written(tmp_path):
    import json
    w = World({0, 1})
    rt = make(w, pool=2)
    rt.status_path = tmp_path / "s.json"
    rt.record_steps(10, 2.0)
    rt.set_threads(intra=1)
    data = json.loads(rt.status_path.read_text())
    assert data["intra_active"] == 1 and data["steps_per_s"] == {"2": 5.0}
    assert data["last_resize"]["intra_before"] == 2 and data["last_resize"]["intra_after"] == 1


def test_cpuset_grow_seen_when_kernel_keeps_our_pinning():
    # Kernels >= 6.2 keep a mask set by sched_setaffinity when a cpuset grows (the user mask
    # survives), so after a shrink and a grow only the cpuset file tells. Seen on this machine.
    w = World({0, 1, 2, 3})
    w.cpuset_cpus = frozenset({0, 1, 2, 3})
    rt = make(w)
    w.cpuset_cpus = frozenset({0})
    w.mask = frozenset({0})            # the kernel: pinned & cpuset
    assert rt.refresh_allowance() and rt.state().intra_active == 1
    w.cpuset_cpus = frozenset({0, 1, 2, 3})  # grow; the mask stays what we pinned ({0})
    assert rt.refresh_allowance() and rt.state().intra_active == 4
    assert rt.state().share_cpus == {0, 1, 2, 3}


def test_slurm_step_cpuset_grow_after_start_on_one_core():
    # A rank started by Slurm on one core: its mask is the step's cpuset, not a restriction.
    # Seen in a real job: the co-scheduler grows the step cpuset, the mask stays {0}.
    w = World({0})
    w.cpuset_cpus = frozenset({0})
    rt = make(w, pool=2)
    assert rt.state().intra_active == 1
    w.cpuset_cpus = frozenset({0, 1})
    assert rt.refresh_allowance()
    assert rt.state().intra_active == 2 and rt.state().share_cpus == {0, 1}


def test_taskset_narrower_than_cpuset_is_a_restriction_until_lifted():
    w = World({0, 1, 2, 3})
    w.cpuset_cpus = frozenset({0, 1, 2, 3})
    rt = make(w)
    w.mask = frozenset({2})
    assert rt.refresh_allowance() and rt.state().allowed_cpus == {2}
    w.cpuset_cpus = frozenset({1, 2, 3})            # the cpuset changes; the restriction holds
    rt.refresh_allowance()
    assert rt.state().allowed_cpus == {2}
    w.mask = frozenset({1, 2, 3})              # taskset lifts it (mask = whole cpuset)
    assert rt.refresh_allowance() and rt.state().allowed_cpus == {1, 2, 3}


def test_move_to_another_cgroup_is_not_taken_for_a_taskset():
    # The reader still looks at the old cgroup until invalidated; the runtime must re-locate
    # before calling a mask change an outside restriction (seen in a real run).
    class Stale(World):
        def __init__(self, cpus):
            super().__init__(cpus)
            self.located = frozenset(cpus)   # what the reader would answer before re-locating

        def cpuset(self):
            return self.located

        def invalidate(self):
            self.located = self.cpuset_cpus

    w = Stale({0, 1})
    w.cpuset_cpus = frozenset({0, 1})
    rt = make(w, pool=2)
    w.cpuset_cpus = frozenset({0})   # moved to a new cgroup, then shrunk: mask follows
    w.mask = frozenset({0})
    assert rt.refresh_allowance() and rt.state().intra_active == 1
    w.cpuset_cpus = w.located = frozenset({0, 1})  # grown; mask stays pinned at {0}
    assert rt.refresh_allowance() and rt.state().intra_active == 2


def test_cgroup_mode_ignores_a_launch_binding():
    # Slurm binds a task to its allocation at launch; the co-scheduler grew the cpuset before.
    w = World({1})
    w.cpuset_cpus = frozenset({0, 1})
    rt = Runtime(*fake_tf_adapter(w.calls, 2), local_rank=0, local_size=1,
                 read_affinity=lambda: w.mask, cgroup=w, pin=w.pin, mask_restricts=False)
    rt.set_threads(reason="init")
    assert rt.state().allowed_cpus == {0, 1} and rt.state().intra_active == 2
