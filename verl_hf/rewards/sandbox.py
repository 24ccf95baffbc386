"""Run generated code in a sandbox: never inside the trainer's process, and held by the kernel where it allows.

Each program runs in a fresh subprocess (its own session), in a temporary working directory that is deleted
afterwards, with a wall-clock timeout (the whole process group is killed), CPU-time, address-space and
file-size limits, no capabilities, output to files (a print loop cannot fill the trainer's memory), and four
layers, each installed before the program's first line and none removable by it (the child side, with the
details: sandbox_child.py):

- "seccomp": no new processes or programs, no sockets but a socketpair, no changes to files' metadata, no
  memfd, io_uring, ptrace, mounts or namespaces; threads work. Linux x86_64/aarch64.
- "landlock": reads only where the interpreter's own files are, writes only under the working directory,
  for every route, native code (sqlite, ctypes) included; no execution of files; no TCP (ABI >= 4); no
  signals to processes outside (ABI >= 6). Linux >= 5.13 with Landlock enabled.
- "namespaces": network, PID and mount namespaces of its own (`unshare`; a user namespace too unless the
  trainer runs as root): no network interface but an unconfigured loopback, every process it made dies with
  it, and its directory is a tmpfs of `file_mb` (total disk use bounded).
- "audit": a Python audit hook with the same rules and messages that say what was refused. Everywhere, but
  Python-level only.

`sandbox_layers()` says which layers this machine enforces (each installed once in a probe program, so a
container that forbids one shows it), `sandbox_guarantees()` what that adds up to, and `report_sandbox()`
logs it once (resolve_reward_funcs calls it when the `code` reward is configured).

A program passes only if it runs to its end: the guard then prints a one-time marker (read from stdin before
the program starts). `sys.exit(0)` or `os._exit(0)` before the tests therefore fails instead of passing. The
marker lives in the interpreter's memory: the audit hook refuses the introspection that reaches it (the
garbage collector's lists, other threads' frames, tracing), but no kernel layer can see inside the
interpreter, so a program that walks its own frames up to the guard's can still find it.

See it work: tests/test_sandbox.py.
"""

from __future__ import annotations

import logging
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

LAYERS = ("seccomp", "landlock", "namespaces", "audit")
_CHILD = Path(__file__).with_name("sandbox_child.py")
_UNSHARE = ["unshare", "--mount", "--net", "--ipc", "--pid", "--fork", "--kill-child"]  # + a user one unless root
_USER_NAMESPACE = ["--user", "--map-root-user"]
# Each promise: its parts, and the layers any one of which keeps that part ("landlock4": Landlock ABI >= 4).
_PROMISES = {
    "no process outlives the call": {"processes": ("seccomp", "namespaces")},
    "no new programs": {"execve": ("seccomp", "landlock")},
    "no writes outside its directory": {"contents and names": ("landlock",),
                                        "modes, owners, times, extended attributes": ("seccomp",)},
    "no reads outside the interpreter's files": {"reads": ("landlock",)},
    "no network": {"TCP": ("seccomp", "namespaces", "landlock4"), "UDP": ("seccomp", "namespaces"),
                   "unix sockets": ("seccomp",)},
    "no signals to other processes": {"signals": ("namespaces", "landlock6")},
    "memory and disk bounded": {"memory outside the address-space limit (memfd, SysV shared memory)": ("seccomp",),
                                "total disk use (each file is capped anyway)": ("namespaces",)},
    "nothing outlives the call, nothing passes between calls": {
        "SysV IPC, POSIX queues": ("seccomp", "namespaces"), "keyrings": ("seccomp",)},
    "no effect on other processes' limits or scheduling": {"prlimit, priorities, affinity": ("seccomp",)},
}


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
def sandbox_layers() -> dict[str, str | None]:
    """Each layer of LAYERS -> how this machine enforces it, or None where it cannot: detected, then each
    kernel layer installed alone in a probe program (once per process)."""
    linux = sys.platform == "linux"
    seccomp = linux and platform.machine() in ("x86_64", "aarch64") and _proc_status_has("Seccomp")
    abi = _landlock_abi() if linux else 0
    unshare = _working_unshare() if linux else None
    found = {"seccomp": "seccomp filter" if seccomp else None, "landlock": f"Landlock ABI {abi}" if abi else None,
             "namespaces": " ".join(unshare[1:unshare.index("--fork")]).replace("--", "") + " namespaces"
             if unshare else None, "audit": "Python audit hook"}
    for layer in ("seccomp", "landlock", "namespaces"):
        if found[layer] and not _execute("print('ok')", (layer,), 30.0, 256, 4, 1_000, True).passed:
            logger.warning("code sandbox: the %s layer is present but could not be installed here", layer)
            found[layer] = None
    return found


def sandbox_guarantees() -> dict[str, str]:
    """Each promise -> the layers that keep each of its parts on this machine, or 'NOT enforced ...'."""
    layers = sandbox_layers()
    abi = int(layers["landlock"].split()[-1]) if layers["landlock"] else 0
    names = {**layers, "landlock4": layers["landlock"] if abi >= 4 else None,
             "landlock6": layers["landlock"] if abi >= 6 else None}
    out = {}
    for promise, parts in _PROMISES.items():
        held = {part: sorted({names[n] for n in keepers if names[n]}) for part, keepers in parts.items()}
        missing = [part for part, by in held.items() if not by]
        kept = "; ".join(f"{part}: {' + '.join(by)}" if len(parts) > 1 else " + ".join(by)
                         for part, by in held.items() if by)
        out[promise] = (f"NOT enforced by the kernel here ({', '.join(missing)}: audit hook only)"
                        + (f"; {kept}" if kept else "")) if missing else kept
    return out


@lru_cache(maxsize=1)
def report_sandbox() -> dict[str, str]:
    """Log, once per process, what the sandbox guarantees on this machine; a warning where the kernel does
    not enforce something. Returns sandbox_guarantees()."""
    guarantees = sandbox_guarantees()
    weak = [promise for promise, how in guarantees.items() if how.startswith("NOT")]
    lines = "; ".join(f"{promise}: {how}" for promise, how in guarantees.items())
    if weak:
        logger.warning("code sandbox: %s. Where the kernel does not hold a promise, run untrusted code in a "
                       "container or VM too (README, 'The code sandbox').", lines)
    else:
        logger.info("code sandbox: %s.", lines)
    return guarantees


def run_code(code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 16,
             max_output_chars: int = 10_000, as_main: bool = True,
             layers: tuple[str, ...] | None = None) -> SandboxResult:
    """Run a Python program in the sandbox. `as_main=False` runs it with `__name__ != "__main__"` (a solution
    under test: its own main block does not run) and counts any `SystemExit` as not finished. `file_mb` caps
    each file, and with the namespaces layer the directory's total. stdout/stderr are cut to
    `max_output_chars`. `layers`: a subset of LAYERS (default: every one this machine has); asking for one
    the machine lacks is an error."""
    return _execute(code, _chosen_layers(layers), timeout_s, memory_mb, file_mb, max_output_chars, as_main, stdin)


def _execute(code: str, layers: tuple[str, ...], timeout_s: float, memory_mb: int, file_mb: int,
             max_output_chars: int, as_main: bool, stdin: str = "") -> SandboxResult:
    marker = secrets.token_hex(16)
    limits = [str(max(1, int(timeout_s) + 1)), str(memory_mb * 2**20), str(file_mb * 2**20), str(int(as_main))]
    cmd = [sys.executable, "-I", "-B", str(_CHILD), *limits, ",".join(layers) or "none"]
    if "namespaces" in layers:
        cmd = [*_working_unshare(), *cmd]
    root = tempfile.mkdtemp(prefix="verl_hf_sandbox_")
    try:
        workdir = Path(root, "work")
        workdir.mkdir()
        (workdir / "main.py").write_bytes(code.encode("utf-8", "surrogateescape"))  # a lone surrogate: SyntaxError
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(workdir),
               "TMPDIR": str(workdir), "OMP_NUM_THREADS": "1"}
        with open(Path(root, "stdout"), "w+b") as out, open(Path(root, "stderr"), "w+b") as err:
            # start_new_session, not preexec_fn: forking a multi-threaded trainer with preexec_fn can deadlock.
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    start_new_session=True)
            try:
                proc.communicate((marker + "\n" + stdin).encode("utf-8", "surrogateescape"), timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _wait_until_group_is_gone(proc.pid)
                timed_out = True
            stdout, stderr = _read(out), _read(err)
    finally:
        _remove(root)
    finished = stdout.rstrip("\n").endswith(marker)
    if finished:
        stdout = stdout.rstrip("\n")[: -len(marker)].removesuffix("\n")
    return SandboxResult(None if timed_out else proc.returncode, stdout[:max_output_chars],
                         stderr[:max_output_chars], timed_out, finished)


def _chosen_layers(layers) -> tuple[str, ...]:
    available = tuple(name for name, how in sandbox_layers().items() if how)
    if layers is None:
        return available
    unknown = sorted(set(layers) - set(LAYERS))
    missing = sorted(set(layers) - set(available) - set(unknown))
    if unknown or missing:
        raise ValueError(f"run_code(layers={tuple(layers)!r}): " + (f"unknown {unknown} (choose from {LAYERS})"
                         if unknown else f"{missing} not available on this machine (it has {available})"))
    return tuple(name for name in LAYERS if name in layers)


def _proc_status_has(key: str) -> bool:
    try:
        return any(line.startswith(key + ":") for line in open("/proc/self/status"))
    except OSError:
        return False


def _landlock_abi() -> int:
    try:
        from .sandbox_child import landlock_abi
    except (OSError, AttributeError, TypeError):  # no C library to ask
        return 0
    return landlock_abi()


@lru_cache(maxsize=1)
def _working_unshare() -> list[str] | None:
    """The `unshare` command that gives the program its namespaces here, or None. As root, without a user
    namespace first (the program then keeps root's uid, with every capability dropped); otherwise, or where
    that is refused (a container without CAP_SYS_ADMIN), inside a user namespace of its own."""
    if shutil.which("unshare") is None:
        return None
    forms = [_UNSHARE, [_UNSHARE[0], *_USER_NAMESPACE, *_UNSHARE[1:]]]
    for form in forms if os.geteuid() == 0 else forms[1:]:
        try:
            if subprocess.run([*form, "true"], capture_output=True, timeout=10).returncode == 0:
                return form
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def _wait_until_group_is_gone(group: int, limit_s: float = 5.0) -> None:
    """SIGKILL is delivered at once but a process takes a moment to die (and one inside the PID namespace is
    not our child, so `wait` cannot see it): return only once no live member of the group is left, so that
    nothing the program started outlives `run_code`. Zombies are dead and do not count."""
    deadline = time.monotonic() + limit_s
    while _live_members(group) and time.monotonic() < deadline:
        time.sleep(0.01)


def _live_members(group: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            # /proc/PID/stat: "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ')'
            state, _, pgrp = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == group and state not in ("Z", "X"):
            found.append(int(pid))
    return found


def _remove(root: str) -> None:
    """Delete the program's folder, however deep it nested directories (Python 3.11's rmtree recurses)."""
    try:
        shutil.rmtree(root)
    except (OSError, RecursionError):
        subprocess.run(["rm", "-rf", "--", root], capture_output=True, timeout=60)


def _read(f) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")
