"""Parsers on output captured from Slurm 22.05.8 on this kind of machine and from Slurm 24.11.5
in a docker-slurm trixie container (tests/fixtures)."""
import re
from pathlib import Path

import pytest

from malleable_protocol.cpulist import parse_cpu_list
from malleable_protocol.hostlist import expand_hostlist
from slurm_plugin.slurm.model import JobState, Node
from slurm_plugin.slurm.parsers import (SlurmParseError, parse_sbatch_parsable,
                                        parse_scontrol_ping, parse_nodes_json, parse_squeue_json)

FIX = Path(__file__).parents[2] / "fixtures" / "slurm-22.05"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_squeue_json_fields():
    jobs = {j.job_id: j for j in parse_squeue_json(read("squeue.json"))}
    assert sorted(jobs) == [1, 2, 3, 4]
    j1 = jobs[1]
    assert j1.state is JobState.RUNNING
    assert j1.nodes == ("n1", "n2", "n3")
    assert (j1.user, j1.uid, j1.partition, j1.num_cpus) == ("root", 0, "debug", 3)
    assert j1.comment == "malleable:min=1,max=8"
    assert j1.admin_comment == "malleable:min=1,max=8"
    # A comment with spaces and '=' survives intact (the reason comments come from JSON).
    assert jobs[2].comment == "a comment with spaces Key=Value"
    assert jobs[3].state is JobState.PENDING and jobs[3].nodes == ()


def _scontrol_cpu_ids(text: str) -> dict[int, dict[str, frozenset[int]]]:
    """Test-only reading of the trusted fixture's CPU_IDs, to cross-check the JSON."""
    out = {}
    for line in text.splitlines():
        job_id = int(re.match(r"JobId=(\d+)", line)[1])
        out[job_id] = {node: parse_cpu_list(ids)
                       for expr, ids in re.findall(r"\sNodes=(\S+) CPU_IDs=(\S+)", line)
                       for node in expand_hostlist(expr)}
    return out


def test_cpu_ids_from_json_match_scontrol_captured_at_the_same_moment():
    nodes = {n.name: n for n in parse_nodes_json(read("sinfo_allocated.json"))}
    jobs = parse_squeue_json(read("squeue_mixed.json"))
    expected = _scontrol_cpu_ids(read("scontrol_show_job_d_o_mixed.txt"))
    for job in jobs:
        got = {name: nodes[name].layout.abstract_ids(c) for name, c in job.cores.items()}
        assert got == expected[job.job_id], job.job_id
    by_id = {j.job_id: j for j in jobs}
    assert by_id[3].cores == {"n2": {(0, 0), (0, 1)}, "n3": {(0, 0)}}
    assert by_id[5].cores == {}  # pending


def test_cores_of_a_running_step_are_allocated_too():
    """22.05 marks a core that a running step uses "allocated_and_in_use", not "allocated"
    (openapi/v0.0.38's jobs.c). Captured in vm-slurm's bookworm VMs (Slurm 22.05.8, vm2 numbered
    2 sockets x 2 cores x 2 threads): job 3 ran a step on vm1 and vm2, jobs 1 and 2 had ended."""
    nodes = {n.name: n for n in parse_nodes_json(read("sinfo_step_running.json"))}
    jobs = {j.job_id: j for j in parse_squeue_json(read("squeue_step_running.json"))}
    assert '"allocated_and_in_use"' in read("squeue_step_running.json")
    expected = _scontrol_cpu_ids(read("scontrol_show_job_d_o_step_running.txt"))
    assert expected[3] == {"vm1": {0}, "vm2": {0, 1}}
    for job_id, job in jobs.items():
        got = {name: nodes[name].layout.abstract_ids(c) for name, c in job.cores.items()}
        assert got == expected[job_id], job_id


def test_forged_cpu_ids_in_name_and_comment_are_ignored():
    # Job 4 was submitted with -J "Nodes=n2 CPU_IDs=0-1" and a comment holding a newline and a
    # line that imitates scontrol's detail line "Nodes=n3 CPU_IDs=0-1" (see the .txt fixture).
    jobs = {j.job_id: j for j in parse_squeue_json(read("squeue_hostile.json"))}
    assert "Nodes=n3 CPU_IDs=0-1" in (FIX / "scontrol_show_job_d_hostile.txt").read_text()
    assert jobs[4].nodes == ("n1",)
    assert jobs[4].cores == {"n1": {(0, 0)}}


def test_slurms_abstract_cpu_ids_with_sockets_and_threads():
    """Slurm's abstract ids (not Linux's: slurm_plugin/topology.py maps them on the node)."""
    node = Node(name="x", state="idle", state_flags=(), cpus=8, alloc_cpus=0, partitions=(),
                sockets=2, cores_per_socket=2, threads_per_core=2)
    assert node.layout.abstract_ids(frozenset({(0, 0)})) == {0, 1}
    assert node.layout.abstract_ids(frozenset({(1, 1)})) == {6, 7}
    with pytest.raises(ValueError, match="outside 2 sockets"):
        node.layout.abstract_ids(frozenset({(2, 0)}))


def test_sinfo_json_nodes():
    nodes = {n.name: n for n in parse_nodes_json(read("sinfo_allocated.json"))}
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert nodes["n1"].cpus == 2 and nodes["n1"].alloc_cpus == 2
    assert nodes["n1"].state == "allocated" and not nodes["n1"].is_idle
    idle = parse_nodes_json(read("sinfo.json"))
    assert all(n.cpus == 2 for n in idle)


def test_ping():
    assert parse_scontrol_ping(read("scontrol_ping.txt")) is True
    assert parse_scontrol_ping("Slurmctld(primary) at vm is DOWN\n") is False
    assert parse_scontrol_ping("") is False


def test_bad_json_is_a_typed_error():
    with pytest.raises(SlurmParseError):
        parse_squeue_json("not json")
    with pytest.raises(SlurmParseError, match="errors"):
        parse_squeue_json('{"errors": [{"error": "boom"}], "jobs": []}')
    with pytest.raises(SlurmParseError):
        parse_nodes_json('{"nodes": [{"cpus": 2}]}')  # no name


def test_sbatch_parsable():
    assert parse_sbatch_parsable("42\n") == 42
    assert parse_sbatch_parsable("42;cluster\n") == 42
    with pytest.raises(SlurmParseError):
        parse_sbatch_parsable("sbatch: error: Batch job submission failed")


# --- Slurm 24.11 (captured in docker-slurm's trixie cluster: job 1 one core of tx1, malleable;
# job 2 both cores of tx2, named 'evil"name'; job 3 pending) ---------------------------------
FIX_24 = Path(__file__).parents[2] / "fixtures" / "slurm-24.11"


def test_squeue_json_of_24_11():
    jobs = {j.job_id: j for j in parse_squeue_json((FIX_24 / "squeue.json").read_text())}
    assert sorted(jobs) == [1, 2, 3]
    j1 = jobs[1]
    assert (j1.state, j1.nodes, j1.num_cpus) == (JobState.RUNNING, ("tx1",), 1)
    assert j1.comment == "malleable:min=1,max=node"
    assert j1.admin_comment == "malleable:min=1,max=node,weight=1"
    assert j1.cores == {"tx1": {(0, 0)}}
    assert jobs[2].name == 'evil"name' and jobs[2].cores == {"tx2": {(0, 0), (0, 1)}}
    assert jobs[3].state is JobState.PENDING and jobs[3].nodes == () and jobs[3].cores == {}
    one = parse_squeue_json((FIX_24 / "squeue_one.json").read_text())
    assert [j.job_id for j in one] == [1]


def test_nodes_of_24_11_from_scontrol_and_cpu_ids():
    nodes = {n.name: n for n in parse_nodes_json(
        (FIX_24 / "scontrol_show_nodes.json").read_text(), "scontrol show nodes --json")}
    assert sorted(nodes) == ["tx1", "tx2"]
    assert (nodes["tx1"].state, nodes["tx1"].alloc_cpus, nodes["tx1"].hostname) == ("mixed", 1, "tx1")
    assert (nodes["tx2"].state, nodes["tx2"].cpus, nodes["tx2"].cores_per_socket) == ("allocated", 2, 2)
    jobs = {j.job_id: j for j in parse_squeue_json((FIX_24 / "squeue.json").read_text())}
    assert nodes["tx2"].layout.abstract_ids(jobs[2].cores["tx2"]) == {0, 1}


FIX_26 = Path(__file__).parents[2] / "fixtures" / "slurm-26.05"


def test_squeue_and_nodes_json_of_26_05_in_the_pinned_data_parser():
    """Captured on Debian sid's Slurm 26.05.5 (docker-slurm; capture.sh there)."""
    jobs = {j.job_id: j for j in parse_squeue_json((FIX_26 / "squeue.json").read_text(),
                                                     "v0.0.42")}
    assert sorted(jobs) == [1, 2, 3]
    assert (jobs[1].state, jobs[1].nodes, jobs[1].num_cpus) == (JobState.RUNNING, ("sd1",), 1)
    assert jobs[1].comment == "malleable:min=1,max=node" and jobs[1].cores == {"sd1": {(0, 0)}}
    assert jobs[2].name == 'evil"name' and jobs[2].cores == {"sd2": {(0, 0), (0, 1)}}
    assert jobs[3].state is JobState.PENDING and jobs[3].cores == {}
    assert [j.job_id for j in parse_squeue_json((FIX_26 / "squeue_one.json").read_text(),
                                                "v0.0.42")] == [1]
    nodes = {n.name: n for n in parse_nodes_json(
        (FIX_26 / "scontrol_show_nodes.json").read_text(), "scontrol show nodes --json",
        "v0.0.42")}
    assert (nodes["sd1"].state, nodes["sd1"].alloc_cpus) == ("mixed", 1)
    assert nodes["sd2"].layout.abstract_ids(jobs[2].cores["sd2"]) == {0, 1}


def test_24_11_state_flags_and_unset_numbers():
    node = parse_nodes_json('{"nodes": [{"name": "a", "state": ["IDLE", "DRAIN"], '
                            '"cpus": 4, "port": {"set": false, "infinite": false, "number": 7}}]}')
    assert (node[0].state, node[0].state_flags, node[0].port) == ("idle", ("DRAIN",), 0)
    assert not node[0].is_idle


def test_grouped_sinfo_json_of_24_11_is_refused_not_read_as_no_nodes():
    with pytest.raises(SlurmParseError, match="no 'nodes' list"):
        parse_nodes_json((FIX_24 / "sinfo.json").read_text())
    with pytest.raises(SlurmParseError, match="no 'jobs' list"):
        parse_squeue_json('{"errors": [], "meta": {}}')


def test_client_reads_nodes_with_the_command_of_its_slurm_version():
    from malleable_protocol.runner import CommandResult
    from slurm_plugin.slurm.client import CliSlurmClient
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        if argv == ["sinfo", "--version"]:
            return CommandResult(argv, 0, "slurm 24.11.5\n", "")
        return CommandResult(argv, 0, (FIX_24 / "scontrol_show_nodes.json").read_text(), "")

    assert [n.name for n in CliSlurmClient(runner).nodes()] == ["tx1", "tx2"]
    assert calls == [["sinfo", "--version"], ["scontrol", "show", "nodes", "--json=v0.0.42"]]
    calls.clear()
    old = CliSlurmClient(lambda argv, **kw: (calls.append(argv), CommandResult(
        argv, 0, read("sinfo.json"), ""))[1], slurm_version=(22, 5))
    assert len(old.nodes()) == 3 and calls == [["sinfo", "--json"]]


def test_from_24_11_the_json_is_asked_in_a_pinned_data_parser_and_must_come_in_it():
    from malleable_protocol.runner import CommandResult
    from slurm_plugin.slurm.client import CliSlurmClient
    squeue = (FIX_24 / "squeue.json").read_text()     # captured in v0.0.42, 24.11's default
    calls = []

    def runner(argv, **kw):
        calls.append(argv)
        return CommandResult(argv, 0, squeue, "")

    for version in ((24, 11), (26, 5)):
        calls.clear()
        jobs = CliSlurmClient(runner, slurm_version=version).jobs(layout=())
        assert jobs and calls == [["squeue", "--json=v0.0.42"]]
    other = squeue.replace("data_parser\\/v0.0.42", "data_parser\\/v0.0.43")
    assert other != squeue
    with pytest.raises(SlurmParseError, match="v0.0.43, not the v0.0.42"):
        parse_squeue_json(other, "v0.0.42")
    calls.clear()
    old = CliSlurmClient(lambda argv, **kw: (calls.append(argv), CommandResult(
        argv, 0, read("squeue.json"), ""))[1], slurm_version=(22, 5))
    assert old.jobs(layout=()) and calls == [["squeue", "--json"]]


def test_slurm_version():
    from slurm_plugin.slurm.parsers import parse_slurm_version
    assert parse_slurm_version("slurm-wlm 22.05.8\n") == (22, 5)
    assert parse_slurm_version("slurm 24.11.5\n") == (24, 11)
    with pytest.raises(SlurmParseError):
        parse_slurm_version("sinfo: fatal: Could not establish a configuration source")


def test_the_accounting_of_many_jobs_is_one_sacct_and_one_sacctmgr_process():
    from malleable_protocol.runner import CommandResult
    from slurm_plugin.slurm.client import CliSlurmClient
    calls = []

    def runner(argv, **kw):
        calls.append((argv, kw.get("input")))
        return CommandResult(argv, 0, "9|x\n7|\n12|old\n", "")

    client = CliSlurmClient(runner, slurm_version=(24, 11))
    # 12 was not asked for: left out; 8 has no record: absent.
    assert client.system_comments([9, 7, 8, 7]) == {7: "", 9: "x"}
    assert calls == [(["sacct", "-X", "-n", "-P", "-j", "7,8,9", "-o", "JobIDRaw,SystemComment"],
                      None)]
    calls.clear()
    client.set_system_comments({9: "a malleable:b=1", 7: "malleable:b=2"})
    assert calls == [(["sacctmgr", "-i"],
                      'modify job where jobid=7 set SystemComment="malleable:b=2"\n'
                      'modify job where jobid=9 set SystemComment="a malleable:b=1"\n')]
    calls.clear()
    for bad in ('say "hi"', "a\\b", "x\ny", "x" * 1025):
        with pytest.raises(ValueError):
            client.set_system_comments({7: bad})
    with pytest.raises(ValueError):
        client.set_system_comments({0: "x"})
    assert client.system_comments([]) == {} and calls == []
