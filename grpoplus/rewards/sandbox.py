"""Run untrusted Python (model-generated code) under hard limits.

Each call gets a fresh work directory and a fresh process group, started through a tiny
launcher that, before ``exec``-ing the interpreter, sets the resource limits
(RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE), moves into a new
network namespace (``unshare(CLONE_NEWNET)``: only a downed loopback, no route out) and,
when started as root, drops to a uid used by no other process so that RLIMIT_NPROC binds
and the file system's permissions apply. At the end, whatever happened, the process group
and every process still running under that uid are killed, so no child outlives the call.

What is and is not isolated is recorded in every :class:`SandboxResult`
(``network_isolated``, ``user_isolated``) and described in ``docs/how-to/own-reward.md``, section Code sandbox.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

from grpoplus.rewards.events import count_event

# uids handed to sandboxed code when running as root: high, unnamed, one per (process, call)
_UID_BASE = 1_900_000_000
_uid_counter = itertools.count()

_LAUNCHER = r"""
import ctypes, os, resource, sys
status_fd, uid, cpu_s, mem_b, fsize_b, nproc, nofile, hide = (int(a) for a in sys.argv[1:9])
interpreter, script, root, shown = sys.argv[9], sys.argv[10], sys.argv[11], sys.argv[12].split(":")
def limit(kind, value):
    resource.setrlimit(kind, (value, value))
limit(resource.RLIMIT_CPU, cpu_s)
limit(resource.RLIMIT_FSIZE, fsize_b)
limit(resource.RLIMIT_NOFILE, nofile)
limit(resource.RLIMIT_CORE, 0)
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
def mount(src, dst, fstype, flags, data=None):
    if libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags, data and data.encode()):
        raise OSError(ctypes.get_errno(), "mount " + dst)
def expose(path, writable):
    dst = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(os.readlink(path), dst)
        return
    if os.path.isdir(path):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(path, dst, None, MS_BIND | MS_REC)
    if not writable:
        mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
def hide_host():
    # a root of its own: the interpreter's files read-only, the work directory writable, nothing else
    if libc.unshare(CLONE_NEWNS):
        return "unshare(CLONE_NEWNS): " + os.strerror(ctypes.get_errno())
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path in shown:
            if os.path.lexists(path):
                expose(path, writable=False)
        expose(os.getcwd(), writable=True)
        work = os.getcwd()
        os.chroot(root)
        os.chdir(work)
    except OSError as err:
        return (err.filename or "") + " " + os.strerror(err.errno or 0)
    return ""
net = libc.unshare(CLONE_NEWNET) == 0
if not net and uid < 0:  # unprivileged: a user namespace grants the right to a net namespace
    net = libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
refused = hide_host() if hide else ""
if refused:  # never run the code with the host's files in view when they should be hidden
    os.write(status_fd, b"refused=" + refused.encode() + b"\n")
    sys.exit(125)
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
libc.prctl(1, 9)  # PR_SET_PDEATHSIG=SIGKILL (after setuid, which clears it): dies with its caller
limit(resource.RLIMIT_NPROC, nproc)
limit(resource.RLIMIT_AS, mem_b)
os.write(status_fd, b"net=%d user=%d files=%d\n" % (net, uid >= 0, hide))
os.close(status_fd)
os.execve(interpreter, [interpreter, "-I", "-B", script], {
    "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.getcwd(), "TMPDIR": os.getcwd(),
    "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"})
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_python` call.

    ``status``: ``ok`` (exit 0), ``error`` (non-zero exit, e.g. an exception),
    ``timeout`` (wall clock or CPU limit), ``memory`` (allocation refused),
    ``file_size`` (wrote past the file-size/output limit), ``sandbox_error`` (the
    sandbox itself could not start the code).
    """

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    wall_s: float
    network_isolated: bool
    user_isolated: bool
    files_isolated: bool = False  # only the interpreter's files and the work directory were visible


# What sandboxed code sees of the host when its files are hidden: the system's programs and libraries, read-only
# (the interpreter, its standard library, the shared libraries they load), and the devices Python reads.
SHOWN = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom",
         "/dev/random")
HOST_FILES_OPT_IN = "GRPOPLUS_SANDBOX_HOST_FILES"  # =1: run code rewards with the host's files in view (weaker)


def _shown(interpreter: str) -> list[str]:
    """SHOWN, plus the installation the interpreter lives in when it is elsewhere (e.g. /opt/conda)."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    inside = any(prefix == p or prefix.startswith(p + "/") for p in SHOWN)
    return [*SHOWN, *([] if inside or prefix in ("", "/") else [prefix])]


def _is_root() -> bool:
    return os.geteuid() == 0


@lru_cache(maxsize=None)
def _interpreter_for_sandbox_user(preferred: str) -> str | None:
    """An interpreter a fresh unprivileged uid can run, or None (then no uid drop).

    The venv's interpreter may sit under a private home (``/root`` is 0700); fall back to
    the system's ``python3``.
    """
    for candidate in (preferred, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            probe = subprocess.run(
                [candidate, "-I", "-c", "pass"], user=_UID_BASE - 1, group=_UID_BASE - 1,
                extra_groups=[], capture_output=True, timeout=30, cwd="/",
            )
        except OSError:  # exec refused: a directory on the way is private
            continue
        if probe.returncode == 0:
            return candidate
    return None


def _sweep_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is ``uid`` until none is left (forks race us)."""
    for _ in range(100):
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    status = dict(line.split(":", 1) for line in f if line.startswith(("State:", "Uid:")))
            except (OSError, ValueError):
                continue  # exited meanwhile
            alive = not status.get("State", "Z").strip().startswith(("Z", "X"))  # zombies hold nothing
            if alive and int(status.get("Uid", "-1").split()[0]) == uid:
                found.append(int(entry))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _classify(returncode: int | None, timed_out: bool, stderr: str) -> str:
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if returncode == -signal.SIGXFSZ:
        return "file_size"
    if returncode == 0:
        return "ok"
    tail = stderr[-2000:]
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return "memory"
    if "File too large" in tail:  # Python ignores SIGXFSZ, the write fails with EFBIG instead
        return "file_size"
    return "error"


def _read_capped(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def check_limits(timeout_s: float, memory_mb: int, **_) -> None:
    """Refuse limits no program can run under: the one statement of this refusal, for :func:`run_python` and the
    ``code`` reward's parameters as the specs are parsed (``code_batch.check_options``: the config rule ``rewards``)."""
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"run_python needs timeout_s > 0 and memory_mb > 0, got {timeout_s}, {memory_mb}")


def run_python(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    cpu_s: int | None = None,
    max_processes: int = 32,
    max_file_mb: int = 16,
    max_open_files: int = 64,
    max_output_bytes: int = 1 << 20,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` as a Python script in a throwaway sandbox; see the module docstring.

    ``timeout_s`` bounds wall-clock time (the CPU limit defaults to ``ceil(timeout_s) + 1``
    seconds); ``memory_mb`` the address space; ``max_file_mb`` every file written,
    stdout and stderr included; ``max_processes`` the processes of the sandbox user (binds
    only when the call can drop to a fresh uid, i.e. runs as root). ``python`` defaults to
    this interpreter, or the system's when a fresh uid cannot run this one.

    >>> run_python("print(input()[::-1])", stdin="abc", timeout_s=5).stdout
    'cba\\n'
    """
    check_limits(timeout_s, memory_mb)
    interpreter = os.path.realpath(python or sys.executable)  # a venv's link would point outside the shown files
    uid = -1
    if _is_root():
        usable = _interpreter_for_sandbox_user(interpreter)
        if usable is not None:
            interpreter, uid = usable, _UID_BASE + (os.getpid() % 90_000) * 1000 + next(_uid_counter) % 1000
    cpu = cpu_s if cpu_s is not None else int(timeout_s) + 2
    private = tempfile.mkdtemp(prefix="grpoplus-sbx-io-")  # root-only: stdin/stdout/stderr files
    workdir = tempfile.mkdtemp(prefix="grpoplus-sbx-")
    try:
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        if uid >= 0:
            os.chown(workdir, uid, uid)
            os.chown(script, uid, uid)
        return _run_in(workdir, private, interpreter, uid, stdin, timeout_s, cpu, memory_mb,
                       max_processes, max_file_mb, max_open_files, max_output_bytes)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def _run_in(workdir, private, interpreter, uid, stdin, timeout_s, cpu, memory_mb,
            max_processes, max_file_mb, max_open_files, max_output_bytes) -> SandboxResult:
    paths = {name: os.path.join(private, name) for name in ("stdin", "stdout", "stderr")}
    with open(paths["stdin"], "w", encoding="utf-8") as f:
        f.write(stdin)
    root = os.path.join(private, "root")  # the hidden-files root's mount point (a tmpfs inside the namespace)
    os.mkdir(root)
    hide = os.environ.get(HOST_FILES_OPT_IN, "") != "1"
    status_r, status_w = os.pipe()
    args = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(status_w), str(uid), str(cpu),
            str(memory_mb << 20), str(max_file_mb << 20), str(max_processes), str(max_open_files), str(int(hide)),
            os.path.realpath(interpreter), os.path.join(workdir, "main.py"), root, ":".join(_shown(interpreter))]
    start = time.monotonic()
    with open(paths["stdin"], "rb") as fin, open(paths["stdout"], "wb") as fout, open(paths["stderr"], "wb") as ferr:
        proc = subprocess.Popen(args, stdin=fin, stdout=fout, stderr=ferr, cwd=workdir,
                                start_new_session=True, pass_fds=(status_w,), env={})
    os.close(status_w)
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_everything(proc, uid)
    wall = time.monotonic() - start
    with os.fdopen(status_r, "rb") as f:
        report = f.read().decode()
    stdout = _read_capped(paths["stdout"], max_output_bytes)
    stderr = _read_capped(paths["stderr"], max_output_bytes)
    if not report or report.startswith("refused="):
        count_event("sandbox/sandbox_error")
        if report:  # the host's files could not be hidden: the code did not run
            stderr = (f"the code sandbox could not hide the host's files ({report[len('refused='):].strip()}); run "
                      "where mount namespaces are allowed (root, or unprivileged user namespaces), or set "
                      f"{HOST_FILES_OPT_IN}=1 to run code rewards with the host's files in view")
        return SandboxResult("sandbox_error", stdout, stderr, proc.returncode, wall, False, False)
    status = _classify(proc.returncode, timed_out, stderr)
    count_event(f"sandbox/{status}")
    return SandboxResult(status, stdout, stderr, proc.returncode, wall, network_isolated="net=1" in report,
                         user_isolated="user=1" in report, files_isolated="files=1" in report)


def _kill_everything(proc: subprocess.Popen, uid: int) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty
    proc.wait()
    if uid >= 0:
        _sweep_uid(uid)  # children that left the process group (setsid, double fork)
