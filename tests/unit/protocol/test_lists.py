import pytest

from malleable_protocol.cpulist import format_cpu_list, parse_cpu_list
from malleable_protocol.hostlist import expand_hostlist


@pytest.mark.parametrize("text,cpus", [
    ("", set()), ("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-1,4,6-7", {0, 1, 4, 6, 7}),
    (" 2 \n", {2}),
])
def test_parse_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("bad", ["a", "1-", "-1", "3-1", "1,,2", "0-70000", "1;2"])
def test_parse_cpu_list_rejects(bad):
    with pytest.raises(ValueError):
        parse_cpu_list(bad)


def test_format_roundtrip():
    for s in ["0", "0-3", "0-1,4,6-7", "1,3,5"]:
        assert format_cpu_list(parse_cpu_list(s)) == s
    assert format_cpu_list([]) == ""


@pytest.mark.parametrize("expr,names", [
    ("n1", ["n1"]), ("n[1-3]", ["n1", "n2", "n3"]), ("n[1,3]", ["n1", "n3"]),
    ("n[1-2],m5", ["n1", "n2", "m5"]), ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]), ("", []), ("(null)", []),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[a-b]", "n[3-]"])
def test_expand_hostlist_rejects(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)
