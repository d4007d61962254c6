"""The agent-rank protocol: records with bounds, the one share function, safe file access."""
import json
import os
import signal

import pytest

from malleable_protocol import (ProtocolError, RankStatus, RunLayout, Target, is_reload_signal,
                                rank_share, threads_per_rank)
from malleable_protocol.records import MAX_RECORD_BYTES, decode_json_bounded
from malleable_protocol.safe_io import (UnsafePath, ensure_private_dir, list_bounded, open_dir,
                                        read_bounded, write_atomic)

GOOD = dict(pid=10, rank=0, local_rank=0, local_size=1, intra_active=2, intra_pool=4,
            inter_active=2, inter_pool=4)


def test_records_round_trip():
    t = Target(frozenset({0, 1, 5}), generation=7)
    assert Target.decode(t.encode()) == t
    st = RankStatus(**GOOD, steps_per_s={2: 3.5}, steps=12, allowed_cpus=frozenset({0, 1}))
    assert RankStatus.decode(st.encode()) == st


def test_a_status_record_names_its_reload_signal():
    for signo in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGRTMIN, signal.SIGRTMIN + 3,
                  signal.SIGRTMAX, None):
        st = RankStatus(**GOOD, reload_signal=signo)
        assert RankStatus.decode(st.encode()).reload_signal == signo
    # A record from a runtime older than the field: it took SIGUSR1.
    assert RankStatus.decode(json.dumps(GOOD).encode()).reload_signal == signal.SIGUSR1
    with pytest.raises(ProtocolError):
        RankStatus(**GOOD, reload_signal=signal.SIGKILL).encode()


@pytest.mark.parametrize("bad", [0, -1, 1, signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP,
                                 signal.SIGCHLD, signal.SIGRTMIN - 1, signal.SIGRTMAX + 1,
                                 2**64, 10.0, True, "10", "SIGUSR1", [10], {}])
def test_a_reload_signal_other_than_usr1_usr2_or_real_time_is_refused(bad):
    with pytest.raises(ProtocolError, match="reload_signal"):
        RankStatus.decode(json.dumps({**GOOD, "reload_signal": bad}).encode())
    assert not is_reload_signal(bad)


@pytest.mark.parametrize("bad", [
    b"x" * (MAX_RECORD_BYTES + 1), b"[]", b"not json", b"[" * 100000, b'{"a":' * 5000,
    json.dumps({**GOOD, "pid": -1}).encode(), json.dumps({**GOOD, "intra_active": 0}).encode(),
    json.dumps({**GOOD, "intra_active": True}).encode(),
    json.dumps({**GOOD, "local_rank": 1}).encode(),          # not below local_size
    json.dumps({**GOOD, "steps_per_s": {"two": 1.0}}).encode(),
    json.dumps({**GOOD, "steps_per_s": {"2": "fast"}}).encode(),
    json.dumps({**GOOD, "steps_per_s": {str(i): 1.0 for i in range(300)}}).encode(),
    json.dumps({**GOOD, "allowed_cpus": "0-99999999"}).encode(),
])
def test_status_records_are_refused_with_a_protocol_error_only(bad):
    with pytest.raises(ProtocolError):
        RankStatus.decode(bad)


def test_depth_is_checked_before_parsing_and_strings_do_not_count():
    assert decode_json_bounded(b'{"a": "[[[[[[[[[[[["}') == {"a": "[[[[[[[[[[[["}
    with pytest.raises(ProtocolError, match="deeper"):
        decode_json_bounded(b'{"a": [[[[{"b": 1}]]]]}')


@pytest.mark.parametrize("bad", [b'{"cpus": ""}', b'{"cpus": "3-1"}', b'{"generation": 1}',
                                 b'{"cpus": "0", "generation": -1}', b'{"cpus": 5}'])
def test_bad_targets(bad):
    with pytest.raises(ProtocolError):
        Target.decode(bad)


@pytest.mark.parametrize("cpus,size,shares", [
    ({0, 1, 2, 3}, 2, [{0, 1}, {2, 3}]),
    ({0, 1, 2}, 2, [{0, 1}, {2}]),
    ({4, 9}, 1, [{4, 9}]),
    ({0}, 3, [{0}, {0}, {0}]),
])
def test_rank_share_splits_without_overlap(cpus, size, shares):
    assert [rank_share(cpus, r, size) for r in range(size)] == shares
    assert threads_per_rank(cpus, size) == tuple(len(s) for s in shares)


def test_threads_per_rank_counts_rank_shares_blocks():
    """threads_per_rank counts the blocks' sizes without making them: the same as rank_share's,
    for every size of set and of rank count up to 70 (more ranks than cores too)."""
    import random
    rng = random.Random(3)
    for n in range(1, 70):
        cpus = frozenset(rng.sample(range(128), n))
        for size in range(1, 71):
            assert threads_per_rank(cpus, size) == \
                tuple(len(rank_share(cpus, r, size)) for r in range(size)), (n, size)
    for bad_size in (0, -1, True):
        with pytest.raises(ValueError):
            threads_per_rank({0}, bad_size)
    with pytest.raises(ValueError):
        threads_per_rank(set(), 1)


def test_rank_share_bad_input():
    for lr, ls in ((1, 1), (-1, 2), (0, 0), (True, 2)):
        with pytest.raises(ValueError):
            rank_share({0}, lr, ls)
    with pytest.raises(ValueError):
        rank_share(set(), 0, 1)


def test_layout_refuses_hostile_names():
    lay = RunLayout()
    assert str(lay.target_file(5, "n1")) == "/run/malleable/targets/job_5.n1.json"
    assert str(lay.status_file(5, 3)) == "/run/malleable/jobs/job_5/rank_3.json"
    for node in ("", "..", "a/b", "../x", "n1\n"):
        with pytest.raises(ValueError):
            lay.target_file(5, node)
    for job in (0, -1, True, "5"):
        with pytest.raises(ValueError):
            lay.job_dir(job)
    assert RunLayout.parse_status_name("rank_12.json") == 12
    assert RunLayout.parse_status_name("target-n1.json") is None
    assert RunLayout.parse_status_name("rank_x.json") is None
    assert RunLayout.parse_status_name("rank_3.step_12.json") == 3
    assert RunLayout.parse_status_name("rank_3.step_batch.json") == 3
    for bad in ("rank_3.step_.json", "rank_3.step_1/x.json", "rank_3.task_0.json",
                "rank_3..json", "rank_3.step_1.json.tmp"):
        assert RunLayout.parse_status_name(bad) is None, bad
    assert RunLayout.status_name(3, "step_batch") == "rank_3.step_batch.json"
    with pytest.raises(ValueError):
        RunLayout.status_name(3, "../x")


def test_the_step_of_a_process_from_slurms_step_id():
    from malleable_protocol import step_folder
    assert step_folder(None) == "step_batch"          # a batch script has no SLURM_STEP_ID
    assert step_folder("0") == "step_0" and step_folder("17") == "step_17"
    assert step_folder(str(0xfffffffb)) == "step_batch"
    assert step_folder(str(0xfffffffa)) == "step_interactive"
    # Slurm 26.05 prints them signed (seen in its batch step: SLURM_STEP_ID=-5).
    assert step_folder("-5") == "step_batch" and step_folder("-6") == "step_interactive"
    assert step_folder("-4") == "step_extern"
    for bad in ("-1", "-3", "-7", "-0005", "--5", "x", str(2**32)):
        with pytest.raises(ValueError):
            step_folder(bad)


def test_read_bounded_refuses_links_fifos_big_files_and_strangers(tmp_path):
    (tmp_path / "ok").write_bytes(b"hi")
    (tmp_path / "big").write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "theirs").write_bytes(b"x")
    os.chown(tmp_path / "theirs", 12345, 12345)
    assert read_bounded(tmp_path / "ok", 10) == b"hi"
    with pytest.raises(OSError):            # ELOOP: the link is not followed
        read_bounded(tmp_path / "link", 10)
    with pytest.raises(UnsafePath):         # returns at once: O_NONBLOCK, then not regular
        read_bounded(tmp_path / "fifo", 10)
    with pytest.raises(UnsafePath):
        read_bounded(tmp_path / "big", 10)
    with pytest.raises(UnsafePath):
        read_bounded(tmp_path / "theirs", 10, owner=os.geteuid())
    dfd = open_dir(tmp_path)
    try:
        assert read_bounded("ok", 10, dir_fd=dfd) == b"hi"
        assert len(list_bounded(dfd, 2)) == 2
    finally:
        os.close(dfd)


def test_write_atomic_only_in_a_folder_only_we_can_write(tmp_path):
    safe = ensure_private_dir(tmp_path / "safe")
    write_atomic(safe, "a.json", b"1")
    assert (safe / "a.json").read_bytes() == b"1"
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o1777)
    with pytest.raises(UnsafePath):
        write_atomic(open_to_all, "a.json", b"1")
    # A link planted where the file goes is replaced, never written through.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (safe / "b.json").symlink_to(victim)
    write_atomic(safe, "b.json", b"new")
    assert victim.read_text() == "keep" and (safe / "b.json").read_bytes() == b"new"
    with pytest.raises(ValueError):
        write_atomic(safe, "../x", b"1")


def test_list_bounded_does_not_read_a_huge_folder_whole(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    dfd = open_dir(tmp_path)
    try:
        assert len(list_bounded(dfd, 10)) == 10
    finally:
        os.close(dfd)
