"""Run generated code in a sandbox: never inside the trainer's process.

Each program runs in a fresh subprocess (its own session), in a temporary working directory that is deleted
afterwards, with
- a wall-clock timeout (the whole session is killed),
- CPU-time, address-space and file-size limits (setrlimit, set before the program starts; changing them is
  refused),
- no new programs: a seccomp filter makes execve fail (Linux x86_64 and aarch64),
- no network: a network namespace of its own when the kernel allows unprivileged ones (`unshare -rn`), and
  in any case a Python audit hook that refuses sockets,
- no writes (or directory handles) outside its directory, no new processes, no signals to other processes
  and no native libraries (the audit hook; installed before the program runs, it cannot be removed).
- output to files, capped by the file-size limit (a print loop cannot fill the trainer's memory).

A program passes only if it runs to its end: the guard then prints a one-time marker (read from stdin before
the program starts). `sys.exit(0)` or `os._exit(0)` before the tests therefore fails instead of passing.

The audit hook is a Python-level guard, not an OS jail (a program that walks interpreter frames or patches
the standard library can get around parts of it): at scale run untrusted code inside a container too.

See it work: tests/test_sandbox.py.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Runs first in the child: limits, the audit hook, then the program; the marker only if it ran to its end.
_GUARD = r'''
import sys

def _no_exec():
    """A seccomp filter: execve/execveat fail with EPERM from now on, whatever the Python code does (the OS-level
    block on new programs; the audit hook below also refuses the Python-level calls). Linux x86_64/aarch64."""
    import ctypes, platform, struct
    numbers = {"x86_64": (59, 322), "aarch64": (221, 281)}.get(platform.machine())
    if numbers is None:
        return
    program = [(0x20, 0, 0, 0),                # load the syscall number
               (0x15, 2, 0, numbers[0]),       # execve   -> EPERM
               (0x15, 1, 0, numbers[1]),       # execveat -> EPERM
               (0x06, 0, 0, 0x7FFF0000),       # allow
               (0x06, 0, 0, 0x00050001)]       # errno EPERM
    raw = b"".join(struct.pack("HBBI", *op) for op in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Prog(len(program), ctypes.addressof(buffer))), 0, 0):
        raise OSError(ctypes.get_errno(), "sandbox: could not install the seccomp filter")

def _guarded(cpu_s, memory, file_size, as_main):
    import os, resource, traceback
    marker = sys.stdin.readline().strip()
    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory),
                         (resource.RLIMIT_FSIZE, file_size), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    _no_exec()
    realpath, fsdecode, isdir = os.path.realpath, os.fsdecode, os.path.isdir
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    root = realpath(os.getcwd())
    prefix = root + os.sep
    blocked = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                         "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "sys.addaudithook",
                         "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
                         "os.mkfifo", "os.mknod"))
    changes = frozenset(("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                         "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"))

    def inside(path):
        if isinstance(path, int):
            return True
        real = realpath(fsdecode(path))
        return real == root or real.startswith(prefix) or real == "/dev/null"

    def guard(event, args):
        if event.startswith("socket."):
            raise PermissionError(f"sandbox: network access is blocked ({event})")
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is blocked")
        if event == "open":
            path, mode, flags = args
            wants_write = any(c in mode for c in "wax+") if mode is not None else bool(flags & writes)
            if not inside(path) and (wants_write or isdir(fsdecode(path))):
                raise PermissionError(f"sandbox: writing (or a directory handle) outside the working directory "
                                      f"is blocked ({path})")
        elif event in changes and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise PermissionError(f"sandbox: {event} outside the working directory is blocked")

    sys.addaudithook(guard)
    sys.argv = ["main.py"]
    with open("main.py") as source:
        code = compile(source.read(), "main.py", "exec")
    try:
        exec(code, {"__name__": "__main__" if as_main else "__sandbox__"})
    except SystemExit as stop:
        if not as_main or stop.code not in (None, 0):
            print(f"sandbox: the program exited early (SystemExit({stop.code!r}))", file=sys.stderr)
            sys.stderr.flush()
            os._exit(stop.code if isinstance(stop.code, int) and stop.code else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.write("\n" + marker + "\n")
    sys.stdout.flush()
    os._exit(0)  # no atexit handlers of the program after the marker

_guarded(*(int(a) for a in sys.argv[1:5]))
'''


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    finished: bool = False  # the program ran to its end (the guard's marker was printed)

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and self.finished and not self.timed_out


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare -rn` (an unprivileged network namespace) works on this machine."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_code(code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 16,
             max_output_chars: int = 10_000, as_main: bool = True) -> SandboxResult:
    """Run a Python program in the sandbox. `as_main=False` runs it with `__name__ != "__main__"` (a solution
    under test: its own main block does not run) and counts any `SystemExit` as not finished. stdout/stderr
    are cut to `max_output_chars`."""
    marker = secrets.token_hex(16)
    limits = [str(max(1, int(timeout_s) + 1)), str(memory_mb * 2**20), str(file_mb * 2**20), str(int(as_main))]
    cmd = [sys.executable, "-I", "-c", _GUARD, *limits]  # -I: no user site, no PYTHON* variables
    if network_namespace_available():
        cmd = ["unshare", "-rn", *cmd]
    with tempfile.TemporaryDirectory(prefix="verl_hf_sandbox_") as root:
        workdir = Path(root, "work")
        workdir.mkdir()
        (workdir / "main.py").write_text(code)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(workdir),
               "OMP_NUM_THREADS": "1"}
        with open(Path(root, "stdout"), "w+b") as out, open(Path(root, "stderr"), "w+b") as err:
            # start_new_session, not preexec_fn: forking a multi-threaded trainer with preexec_fn can deadlock.
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    start_new_session=True)
            try:
                proc.communicate((marker + "\n" + stdin).encode(), timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
            stdout, stderr = _read(out), _read(err)
    finished = stdout.rstrip("\n").endswith(marker)
    if finished:
        stdout = stdout.rstrip("\n")[: -len(marker)].removesuffix("\n")
    return SandboxResult(None if timed_out else proc.returncode, stdout[:max_output_chars],
                         stderr[:max_output_chars], timed_out, finished)


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")
