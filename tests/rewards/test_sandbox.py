"""Sandbox guarantees: each test runs the attack the limit exists for."""

import os
import socket
import tempfile
import threading

import pytest

from grpoplus.rewards.sandbox import run_python

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="uid isolation needs root (see docs/how-to/own-reward.md, Code sandbox)")
SANDBOX_UID_MIN = 1_900_000_000


def _live_sandbox_processes() -> list[int]:
    """Live processes running under a uid this test process's sandbox calls drop to (zombies excluded): each process
    draws from its own block of 1000 uids, so another test process's sandboxes (pytest -n) are not counted."""
    own = SANDBOX_UID_MIN + (os.getpid() % 90_000) * 1000
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if line.startswith(("State:", "Uid:")))
        except (OSError, ValueError):
            continue
        if not status["State"].strip().startswith("Z") and own <= int(status["Uid"].split()[0]) < own + 1000:
            pids.append(int(entry))
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_ok_stdin_stdout_and_workdir_is_writable():
    result = run_python("open('scratch.txt', 'w').write('x')\nprint(input() * 2)", stdin="ab", timeout_s=5)
    assert (result.status, result.stdout, result.returncode) == ("ok", "abab\n", 0)


def test_exception_is_error_with_stderr():
    result = run_python("raise KeyError('nope')", timeout_s=5)
    assert result.status == "error" and result.returncode == 1 and "KeyError" in result.stderr


def test_busy_loop_and_sleep_hit_the_wall_clock_limit():
    assert run_python("while True: pass", timeout_s=1).status == "timeout"
    assert run_python("import time; time.sleep(60)", timeout_s=1).status == "timeout"


def test_8gb_allocation_is_refused():
    result = run_python("x = bytearray(8 * 2**30)\nprint('allocated')", timeout_s=5, memory_mb=256)
    assert result.status == "memory" and "allocated" not in result.stdout


def test_output_past_the_file_size_limit_is_stopped():
    result = run_python("import sys\nsys.stdout.write('x' * (3 << 20))", timeout_s=5, max_file_mb=1)
    assert result.status == "file_size"
    assert len(result.stdout) <= 1 << 20


@root_only
def test_write_outside_the_work_directory_fails():
    target_dir = tempfile.mkdtemp()
    os.chmod(target_dir, 0o755)  # owned by root, writable by root only
    target = os.path.join(target_dir, "pwned.txt")
    result = run_python(f"open({target!r}, 'w').write('x')", timeout_s=5)
    assert result.user_isolated and result.files_isolated
    assert result.status == "error" and "FileNotFoundError" in result.stderr  # the directory is not even in view
    assert not os.path.exists(target)
    result = run_python("open('/usr/pwned.txt', 'w').write('x')", timeout_s=5)  # the system's files: read-only
    assert result.status == "error" and "Read-only file system" in result.stderr
    assert not os.path.exists("/usr/pwned.txt")
    os.rmdir(target_dir)


def _secret() -> tuple[str, str]:
    """A world-readable file in an ordinary directory (a data set's answers, a task's hidden tests)."""
    folder = tempfile.mkdtemp(prefix="hidden-tests-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "answers.txt")
    with open(path, "w") as f:
        f.write("42")
    os.chmod(path, 0o644)
    return folder, path


def test_the_hosts_files_are_out_of_sight():
    folder, path = _secret()
    code = (f"import os\nprint(sorted(os.listdir('/')))\n"
            f"for attempt in (lambda: open({path!r}).read(), lambda: os.listdir({folder!r}),\n"
            f"                lambda: os.listdir('/root'), lambda: os.listdir('/home'), lambda: open('/etc/passwd').read()):\n"
            f"    try:\n        print('LEAK', attempt())\n    except OSError as err:\n        print(type(err).__name__)\n")
    result = run_python(code, timeout_s=10)
    assert result.status == "ok" and result.files_isolated, result.stderr
    top, *attempts = result.stdout.splitlines()
    assert set(eval(top)) <= {"usr", "lib", "lib64", "lib32", "bin", "etc", "dev", "tmp"}  # tmp: the work directory's
    assert attempts == ["FileNotFoundError"] * 5 and "42" not in result.stdout


def test_seeing_the_hosts_files_is_an_explicit_opt_in(monkeypatch):
    folder, path = _secret()
    monkeypatch.setenv("GRPOPLUS_SANDBOX_HOST_FILES", "1")
    result = run_python(f"print(open({path!r}).read())", timeout_s=10)
    assert result.status == "ok" and result.stdout == "42\n" and not result.files_isolated


def test_a_host_that_cannot_hide_its_files_runs_no_code_and_says_so_in_one_line(monkeypatch, tmp_path):
    import grpoplus.rewards.sandbox as sandbox

    marker = tmp_path / "ran"
    refusing = ("import os, sys\nos.write(int(sys.argv[1]), b'refused=unshare(CLONE_NEWNS): Operation not permitted\\n')\n"
                "sys.exit(125)\n")
    monkeypatch.setattr(sandbox, "_LAUNCHER", refusing)  # what the launcher reports where mount namespaces are refused
    result = run_python(f"open({str(marker)!r}, 'w')", timeout_s=5)
    assert result.status == "sandbox_error" and not marker.exists()
    assert "\n" not in result.stderr and "could not hide the host's files (unshare(CLONE_NEWNS): Operation not " \
        "permitted)" in result.stderr and "GRPOPLUS_SANDBOX_HOST_FILES=1" in result.stderr


def test_no_network_even_to_a_local_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True)
    thread.start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = run_python(code, timeout_s=5)
    server.close()
    if not result.network_isolated:
        pytest.skip("network namespaces are unavailable here (reported as network_isolated=False)")
    assert result.status == "error" and "connected" not in result.stdout
    assert not accepted


@root_only
def test_process_limit_binds_and_children_are_killed():
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)\n"
    )
    result = run_python(code, timeout_s=5, max_processes=8)
    assert result.status == "ok" and int(result.stdout) < 8  # the 8th process was refused
    assert _live_sandbox_processes() == []  # the sleeping children did not outlive the call


@root_only
def test_fork_bomb_is_contained():
    result = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                        timeout_s=2, max_processes=32)
    assert result.status == "timeout"
    assert _live_sandbox_processes() == []


def test_orphaned_child_in_its_own_session_is_killed():
    code = (
        "import os, subprocess\n"
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
    )
    result = run_python(code, timeout_s=5)
    assert result.status == "ok"
    pid = int(result.stdout.split()[0])
    if not result.user_isolated:
        pytest.skip("without a sandbox uid only the process group is killed (see docs/how-to/own-reward.md, Code sandbox)")
    assert not _alive(pid)
