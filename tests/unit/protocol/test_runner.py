"""The command runner, on real harmless commands."""
import pytest

from malleable_protocol.runner import CommandError, CommandNotFound, CommandTimeout, run_command


def test_success_and_env():
    r = run_command(["sh", "-c", 'echo "$X"'], env={"X": "hello"})
    assert (r.returncode, r.stdout) == (0, "hello\n")


def test_failure_carries_command_code_and_stderr():
    with pytest.raises(CommandError) as info:
        run_command(["sh", "-c", "echo oops >&2; exit 3"])
    err = info.value
    assert err.returncode == 3 and "oops" in err.stderr
    assert err.args_list == ("sh", "-c", "echo oops >&2; exit 3")
    assert "oops" in str(err) and "exit code 3" in str(err)


def test_no_check_returns_result():
    assert run_command(["false"], check=False).returncode == 1


def test_timeout_and_not_found():
    with pytest.raises(CommandTimeout):
        run_command(["sleep", "5"], timeout=0.2)
    with pytest.raises(CommandNotFound):
        run_command(["definitely-not-a-command-xyz"])


def test_shell_string_refused():
    with pytest.raises(TypeError):
        run_command("ls -l")  # type: ignore[arg-type]


def test_input():
    assert run_command(["cat"], input="abc").stdout == "abc"


def test_bytes_that_are_not_utf8_are_replaced_not_fatal():
    """squeue --json passes a job name of b"\\xff" through raw: one user's job name must not
    make every poll of the cluster's watcher fail."""
    r = run_command(["sh", "-c", r"""printf '{"name": "\377"}'; printf '\376' >&2"""])
    assert r.stdout == '{"name": "\ufffd"}' and r.stderr == "\ufffd"
    with pytest.raises(CommandTimeout):      # not UnicodeDecodeError
        run_command(["sh", "-c", r"printf '\377' >&2; sleep 5"], timeout=0.5)
