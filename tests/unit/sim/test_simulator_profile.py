"""Conservative backfill's search for a job wider than a node (``BackfillProfile.earliest_wide``), a
sweep that keeps the held nodes' free cores as it goes, against the direct rule it stands for:
at each candidate time, every node that a reservation of the pass overlaps in the window is
out, and the job fits where the others have its cores."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from malleable_sim.slurm_standin import BackfillProfile, select_nodes

CORES = 4


def direct(profile: BackfillProfile, need: int, length: float) -> tuple[float, dict[int, int]]:
    nodes = range(len(profile._free))
    times = sorted({profile.now, *(t for n in nodes for t in profile.steps(n)[0][1:]),
                    *(end for blocks in profile.blocks.values() for _, end in blocks)})
    for t in times:
        held = {n for n in profile.blocks if profile.clear_from(n, t, length) != t}
        usable = [0 if n in held else profile.free_at(n, t) for n in nodes]
        if sum(usable) >= need:
            return t, select_nodes(usable, need, CORES)
    raise AssertionError("never fits")


@st.composite
def profiles(draw):
    n = draw(st.integers(2, 10))
    now = 10.0
    free, ends_on = [], []
    for _ in range(n):
        running = draw(st.lists(st.tuples(st.integers(0, 6).map(lambda x: now + 5.0 * x),
                                          st.integers(1, 2)), max_size=2))
        used = sum(c for _, c in running)
        if used > CORES:
            running, used = [], 0
        free.append(CORES - used)
        ends_on.append(sorted((end, i, c) for i, (end, c) in enumerate(running)))
    profile = BackfillProfile(free, ends_on, CORES, now)
    for _ in range(draw(st.integers(0, 4))):
        nodes = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))
        start = now + 5.0 * draw(st.integers(0, 6))
        length = 5.0 * draw(st.integers(0, 3))       # zero-length reservations too
        profile.reserve({node: 1 for node in nodes}, start, length)
    return profile, n


@settings(max_examples=400, deadline=None)
@given(profiles(), st.data())
def test_the_sweep_finds_what_the_direct_rule_finds(pn, data):
    profile, n = pn
    need = data.draw(st.integers(1, n * CORES))
    length = 5.0 * data.draw(st.integers(0, 4))
    assert profile.earliest_wide(need, length) == direct(profile, need, length)


@settings(max_examples=300, deadline=None)
@given(profiles(), st.data())
def test_a_pass_of_searches_starts_and_reservations_finds_what_the_direct_rule_finds(pn, data):
    """As a pass uses it: searches one after another, each job reserved or started now before
    the next (a start changes the simulation's state, which the profile reads, and adds a
    release at the job's expected end), so the held nodes and the releases change between
    searches."""
    profile, n = pn
    for job in range(data.draw(st.integers(2, 5))):
        need = data.draw(st.integers(1, n * CORES))
        length = 5.0 * data.draw(st.integers(0, 4))
        found = profile.earliest_wide(need, length)
        assert found == direct(profile, need, length)
        free = profile._free
        with_free = [node for node in range(n) if free[node] > 0]
        if with_free and data.draw(st.booleans()):      # a job of this pass starts now
            nodes = data.draw(st.sets(st.sampled_from(with_free), min_size=1))
            placement = {node: data.draw(st.integers(1, free[node])) for node in nodes}
            end = profile.now + 5.0 * data.draw(st.integers(1, 4))
            for node, cores in placement.items():
                free[node] -= cores
                profile._ends_on[node].append((end, 100 + job, cores))
                profile._ends_on[node].sort()
            profile.started(placement, end)
        else:
            profile.reserve(found[1], found[0], length)
