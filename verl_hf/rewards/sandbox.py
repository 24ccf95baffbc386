"""Run generated code in a sandbox: never inside the trainer's process.

Each program runs in a fresh subprocess, in a temporary working directory that is deleted afterwards, with
- a wall-clock timeout (the whole process group is killed),
- CPU-time, address-space and file-size limits (setrlimit),
- no network: a network namespace of its own when the kernel allows unprivileged ones (`unshare -rn`), and
  in any case a Python audit hook that refuses sockets,
- no writes outside its directory, no new processes and no native libraries (the audit hook; it is
  installed before the program runs and cannot be removed from Python).

The audit hook is a Python-level guard, not an OS jail: run untrusted code at scale behind an OS sandbox
(a container, gVisor, nsjail) as well.

See it work: tests/test_sandbox.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Runs first in the child: refuse sockets, writes outside the working directory, new processes and ctypes.
_GUARD = r'''
import sys

def _make_guard():
    # Everything the guard uses is bound here, in a closure: the program cannot reach or patch it.
    import os
    realpath, fsdecode, O_WRITE = os.path.realpath, os.fsdecode, os.O_WRONLY | os.O_RDWR
    root = realpath(os.getcwd())
    prefixes = (root + os.sep, "/dev/null")
    blocked = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                         "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "sys.addaudithook"))
    changes = frozenset(("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                         "os.link", "os.truncate", "shutil.rmtree", "shutil.copyfile", "shutil.move"))

    def inside(path):
        if isinstance(path, int):
            return True
        real = realpath(fsdecode(path))
        return real == root or real.startswith(prefixes)

    def guard(event, args):
        if event.startswith("socket."):
            raise PermissionError(f"sandbox: network access is blocked ({event})")
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is blocked")
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if mode is not None else bool(flags & O_WRITE)
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing outside the working directory is blocked ({path})")
        elif event in changes and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise PermissionError(f"sandbox: {event} outside the working directory is blocked")
    return guard

sys.addaudithook(_make_guard())
del _make_guard
sys.argv = ["main.py"]
with open("main.py") as _f:
    _code = compile(_f.read(), "main.py", "exec")
del _f
exec(_code, {"__name__": "__main__"})
'''


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare -rn` (an unprivileged network namespace) works on this machine."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(cpu_s: int, memory_mb: int, file_mb: int):
    def apply():  # runs in the child between fork and exec
        import resource

        os.setsid()  # its own process group: a timeout kills everything it started
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_code(code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 16,
             max_output_chars: int = 10_000) -> SandboxResult:
    """Run a Python program in the sandbox; its stdout/stderr are cut to `max_output_chars`."""
    with tempfile.TemporaryDirectory(prefix="verl_hf_sandbox_") as workdir:
        Path(workdir, "main.py").write_text(code)
        cmd = [sys.executable, "-I", "-c", _GUARD]  # -I: no user site, no PYTHON* variables, no cwd on sys.path
        if network_namespace_available():
            cmd = ["unshare", "-rn", *cmd]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": workdir,
               "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=_limits(max(1, int(timeout_s) + 1), memory_mb, file_mb))
        try:
            out, err = proc.communicate(stdin, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
    return SandboxResult(None if timed_out else proc.returncode, out[:max_output_chars], err[:max_output_chars],
                         timed_out)
