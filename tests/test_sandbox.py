"""The code sandbox: generated code runs in a limited subprocess, never in the trainer's process. Each
escape route is tried with every layer on, and again with only the kernel layer that is meant to hold it
alone (`layers=`), so that no layer is trusted because another one happened to stop the program first."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from verl_hf.rewards.sandbox import run_code, sandbox_guarantees, sandbox_layers


def test_infinite_loop_is_killed_within_its_timeout():
    start = time.perf_counter()
    result = run_code("while True:\n    pass\n", timeout_s=1.5)
    elapsed = time.perf_counter() - start
    assert result.timed_out and not result.passed
    assert elapsed < 3.0, elapsed


def test_a_network_connection_is_blocked(tmp_path):
    """A listening socket on this machine: the sandboxed program cannot reach it (or even make a socket)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    result = run_code(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('in')")
    server.close()
    assert not result.passed and "network access is blocked" in result.stderr
    assert "in" not in result.stdout and not accepted


def _needs(layer: str) -> tuple[str]:
    if sandbox_layers()[layer] is None:
        pytest.skip(f"this kernel has no {layer} layer (sandbox_layers() says so, and report_sandbox warns)")
    return (layer,)


@pytest.mark.parametrize("layer", ["seccomp", "namespaces", "landlock"])
def test_the_network_is_unreachable_through_each_kernel_layer_alone(layer):
    """Beneath the audit hook: no socket() at all, its own network namespace (only an unconfigured loopback),
    or Landlock's TCP rules (ABI >= 4)."""
    if layer == "landlock" and "Landlock" not in sandbox_guarantees()["no network"]:
        pytest.skip("Landlock ABI < 4 has no network rules")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)\n"
    result = run_code(code, layers=_needs(layer))
    server.close()
    assert not result.passed and any(m in result.stderr for m in (
        "Permission denied", "Operation not permitted", "unreachable", "refused")), result.stderr[-500:]


def test_writes_outside_the_working_directory_are_blocked(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run_code(f"open({str(target)!r}, 'w').write('x')")
    assert not result.passed and "outside the working directory is blocked" in result.stderr
    assert not target.exists()
    inside = run_code("open('note.txt', 'w').write('kept')\nprint(open('note.txt').read())")
    assert inside.passed and inside.stdout.strip() == "kept"
    renamed = run_code(f"import os\nopen('a', 'w').close()\nos.rename('a', {str(target)!r})")
    assert not renamed.passed and not target.exists()


def test_no_new_processes_and_memory_is_capped():
    spawned = run_code("import subprocess\nsubprocess.run(['echo', 'hi'])")
    assert not spawned.passed and "subprocess.Popen is blocked" in spawned.stderr
    big = run_code("x = bytearray(2 * 1024**3)", memory_mb=256)
    assert not big.passed and "MemoryError" in big.stderr


def test_stdin_stdout_and_the_working_directory_is_removed():
    result = run_code("import os\nprint(int(input()) * 2)\nprint(os.getcwd())", stdin="21\n")
    assert result.passed
    answer, workdir = result.stdout.split()
    assert answer == "42" and not os.path.exists(workdir)


def test_a_program_passes_only_by_running_to_its_end():
    """Exiting early with status 0 (before the tests) fails; a solution's own main block does not run."""
    for early in ("import sys\nsys.exit(0)\nassert False", "import os\nos._exit(0)\nassert False",
                  "import atexit, os\natexit.register(lambda: os._exit(0))\nassert False"):
        result = run_code(early, as_main=False)
        assert not result.passed and not result.finished, early
    solution = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    input()\nassert add(1, 2) == 3\n"
    assert run_code(solution, as_main=False).passed
    assert run_code("import sys\nprint('done')\nsys.exit(0)").passed  # a whole program may exit(0) at its end


def test_no_new_programs_even_around_the_audit_hook(tmp_path):
    """Swapping subprocess's `sys` for one whose audit() does nothing gets past the Python-level hook; the
    seccomp filter still stops the exec."""
    target = tmp_path / "made_by_touch"
    code = ("import subprocess, sys, types\n"
            "fake = types.SimpleNamespace(**{k: getattr(sys, k) for k in dir(sys) if not k.startswith('__')})\n"
            "fake.audit = lambda *a: None\nsubprocess.sys = fake\n"
            f"subprocess.run(['touch', {str(target)!r}])\n")
    result = run_code(code)
    assert not result.passed and "Operation not permitted" in result.stderr
    assert not target.exists()


def test_other_escapes_are_refused(tmp_path):
    for code in (f"import os\nos.open({str(tmp_path / 'made')!r}, os.O_RDONLY | os.O_CREAT)",
                 f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                 "os.open('made', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
                 "import os\nos.kill(os.getppid(), 0)",
                 "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))"):
        result = run_code(code)
        assert not result.passed and "sandbox:" in result.stderr, code
    assert not (tmp_path / "made").exists()
    flood = run_code("while True:\n    print('x' * 1000)", timeout_s=5, file_mb=1)
    assert not flood.passed and len(flood.stdout) <= 10_000 and "File too large" in flood.stderr


def _processes_with_home(workdir: str) -> list[int]:
    """Processes whose environment holds the sandbox's HOME (each program's own, a fresh temporary path)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"HOME={workdir}".encode() in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                found.append(int(pid))
        except OSError:
            pass
    return found


# Forks that never exec (so blocking exec is not enough): os.fork beneath the audit hook, and
# _posixsubprocess.fork_exec (through Popen with the audit call swapped out) with a preexec_fn that sleeps.
_FORKERS = {
    "os.fork": "import os, time\nprint(os.getcwd(), flush=True)\nif os.fork() == 0:\n    time.sleep(60)\n",
    "fork_exec": ("import os, subprocess, sys, time, types\nprint(os.getcwd(), flush=True)\n"
                  "fake = types.SimpleNamespace(**{k: getattr(sys, k) for k in dir(sys) if not k.startswith('__')})\n"
                  "fake.audit = lambda *a: None\nsubprocess.sys = fake\n"
                  "subprocess.Popen(['true'], preexec_fn=lambda: time.sleep(60))\n"),
}


@pytest.mark.parametrize("route", sorted(_FORKERS))
def test_no_process_outlives_the_call(route):
    """Every layer on: the fork itself is refused. The namespaces layer alone: the fork succeeds, and the
    child dies with the sandbox's PID namespace when the program ends. seccomp alone: refused."""
    result = run_code(_FORKERS[route])
    assert not result.passed and ("Operation not permitted" in result.stderr or "os.fork is blocked" in
                                  result.stderr), result.stderr[-500:]
    assert _processes_with_home(result.stdout.split()[0]) == []
    alone = run_code(_FORKERS[route], layers=_needs("seccomp"))
    assert not alone.passed and "Operation not permitted" in alone.stderr, alone.stderr[-500:]
    forked = run_code(_FORKERS["os.fork"] + "print('parent ends')", layers=_needs("namespaces"))
    assert "parent ends" in forked.stdout  # the fork did happen: only the namespace can have cleaned up
    assert _processes_with_home(forked.stdout.split()[0]) == []


def test_threads_still_work_under_the_process_filter():
    code = "import threading\nout = []\nt = threading.Thread(target=out.append, args=(7,))\nt.start()\nt.join()\n" \
           "assert out == [7]\n"
    assert run_code(code).passed and run_code(code, layers=_needs("seccomp")).passed
    # asyncio's self-pipe is a socketpair, which reaches nobody: the kernel filter leaves it (the hook does not)
    assert run_code("import asyncio\nasyncio.run(asyncio.sleep(0))", layers=("seccomp", "landlock")).passed


@pytest.mark.parametrize("route", ["open", "sqlite", "rename", "mkdir", "symlink"])
def test_writes_outside_are_refused_by_landlock_alone(tmp_path, route):
    """Native code (sqlite's own open) and every os call, with the audit hook off: the kernel refuses."""
    target = tmp_path / "escaped"
    code = {"open": f"open({str(target)!r}, 'w').write('x')",
            "sqlite": f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (a)')",
            "rename": f"import os\nopen('a', 'w').close()\nos.rename('a', {str(target)!r})",
            "mkdir": f"import os\nos.mkdir({str(target)!r})",
            "symlink": f"import os\nos.symlink('/etc/passwd', {str(target)!r})"}[route]
    for layers in (None, _needs("landlock")):
        result = run_code(code, layers=layers)
        assert not result.passed and not target.exists(), (layers, result.stderr[-500:])
    inside = run_code(code.replace(str(target), "inside"), layers=("landlock",))
    assert inside.passed, inside.stderr[-500:]


@pytest.mark.parametrize("route", ["a file of the trainer's", "/etc/passwd", "listing /", "/proc of the trainer"])
def test_reads_outside_the_interpreters_files_are_refused(tmp_path, route):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    code = {"a file of the trainer's": f"print(open({str(secret)!r}).read())",
            "/etc/passwd": "print(open('/etc/passwd').read())",
            "listing /": "import os\nprint(os.listdir('/'))",
            "/proc of the trainer": f"print(open('/proc/{os.getpid()}/environ', 'rb').read())"}[route]
    for layers in (None, _needs("landlock")):
        result = run_code(code, layers=layers)
        assert not result.passed and "Permission denied" in result.stderr, (layers, result.stderr[-500:])
        assert "s3cret" not in result.stdout and "root:" not in result.stdout
    # What the interpreter needs still loads: the standard library, C extensions and their shared libraries.
    stdlib = "import json, decimal, sqlite3, ssl, zlib, ctypes.util\nprint(json.dumps(sorted({1, 2})))"
    assert run_code(stdlib, layers=("landlock",)).stdout.strip() == "[1, 2]"


@pytest.mark.parametrize("layer", ["landlock", "namespaces"])
def test_signals_to_other_processes_are_refused_by_each_kernel_layer_alone(layer):
    if layer == "landlock" and "Landlock" not in sandbox_guarantees()["no signals to other processes"]:
        pytest.skip("Landlock ABI < 6 has no signal scoping")
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = run_code(f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)", layers=_needs(layer))
        assert not result.passed and ("Operation not permitted" in result.stderr
                                      or "No such process" in result.stderr), result.stderr[-500:]
        time.sleep(0.2)
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_what_the_machine_enforces_is_reported(caplog, monkeypatch):
    """Every promise names the layers that keep each of its parts, and says plainly which part only the
    audit hook keeps where a layer is missing; the trainer's reward set-up logs it."""
    from verl_hf.rewards import resolve_reward_funcs
    from verl_hf.rewards import sandbox

    guarantees = sandbox_guarantees()
    assert len(guarantees) == 9 and all(how for how in guarantees.values())
    sandbox.report_sandbox.cache_clear()
    with caplog.at_level("INFO", logger="verl_hf.rewards.sandbox"):
        resolve_reward_funcs(["gsm8k"])
        assert "code sandbox:" not in caplog.text
        resolve_reward_funcs(["code"])  # at start-up, when the trainer resolves its rewards
    assert "code sandbox:" in caplog.text and "no writes outside its directory" in caplog.text
    monkeypatch.setattr(sandbox, "sandbox_layers", lambda: {"seccomp": None, "landlock": "Landlock ABI 3",
                                                            "namespaces": None, "audit": "Python audit hook"})
    weak = sandbox.sandbox_guarantees()
    assert weak["no process outlives the call"].startswith("NOT enforced by the kernel here (processes")
    assert weak["no new programs"] == "Landlock ABI 3"
    assert weak["no network"].startswith("NOT enforced by the kernel here (TCP, UDP, unix sockets")
    assert weak["no writes outside its directory"].startswith(
        "NOT enforced by the kernel here (modes, owners, times, extended attributes: audit hook only); "
        "contents and names: Landlock ABI 3")
    assert weak["no signals to other processes"].startswith("NOT")  # Landlock scopes signals from ABI 6
    with pytest.raises(ValueError, match="unknown"):
        run_code("pass", layers=("chroot",))


@pytest.mark.parametrize("route", ["setxattr", "chmod", "chown", "utime"])
def test_metadata_outside_is_not_changed_through_the_filter_alone(tmp_path, route):
    """Landlock leaves metadata alone, and the sandbox may own the file (root, or a user namespace's root):
    the seccomp filter refuses every metadata change, inside the directory too."""
    victim = tmp_path / "victim"
    victim.write_text("x")
    os.chmod(victim, 0o644)
    os.utime(victim, (0, 0))
    before = os.stat(victim)
    call = {"setxattr": "os.setxattr(path, 'user.pwn', b'1')", "chmod": "os.chmod(path, 0o4777)",
            "chown": "os.chown(path, 1234, 1234)", "utime": "os.utime(path, (99, 99))"}[route]
    for layers in (None, _needs("seccomp")):
        result = run_code(f"import os\npath = {str(victim)!r}\n{call}", layers=layers)
        assert not result.passed, (layers, result.stderr[-300:])
    after = os.stat(victim)
    assert (after.st_mode, after.st_uid, after.st_mtime) == (before.st_mode, before.st_uid, before.st_mtime)
    assert os.listxattr(victim) == []


def test_truncating_or_linking_a_file_from_outside_is_refused_by_landlock(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for code in (f"import os\nos.truncate({str(victim)!r}, 0)",
                 f"import os\nos.link({str(victim)!r}, 'in')\nopen('in', 'w').write('pwn')"):
        result = run_code(code, layers=_needs("landlock"))
        assert not result.passed, (code, result.stderr[-300:])
    assert victim.read_text() == "keep"


def test_the_filter_refuses_clone3_memfd_and_other_abis():
    """clone3 (whose flags a filter cannot read) gets ENOSYS, memfd (memory outside RLIMIT_AS) EPERM, and
    a syscall through the x32 ABI kills the process."""
    code = ("import ctypes, errno, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "args = struct.pack('<8Q', 0, 0, 0, 0, 17, 0, 0, 0)\n"  # exit_signal SIGCHLD: a plain fork
            "assert libc.syscall(435, args, len(args)) == -1 and ctypes.get_errno() == errno.ENOSYS\n"
            "assert libc.syscall(319, b'x', 0) == -1 and ctypes.get_errno() == errno.EPERM\n"
            "print('checked', flush=True)\n")
    assert run_code(code, layers=_needs("seccomp")).passed
    if os.uname().machine == "x86_64":
        x32 = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 + 39)\nprint('survived')"  # x32 getpid
        result = run_code(x32, layers=("seccomp",))
        assert result.returncode == -31 and "survived" not in result.stdout  # SIGSYS


@pytest.mark.parametrize("route", ["udp", "unix datagram from a socketpair"])
def test_datagrams_do_not_leave_through_the_filter_alone(tmp_path, route):
    receiver = socket.socket(socket.AF_UNIX if "unix" in route else socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(str(tmp_path / "d.sock") if "unix" in route else ("127.0.0.1", 0))
    receiver.settimeout(0.5)
    address = receiver.getsockname()
    code = ("import _socket\na, b = _socket.socketpair(1, 2)\n" if "unix" in route else
            "import socket\na = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n") + f"a.sendto(b'out', {address!r})"
    result = run_code(code, layers=_needs("seccomp"))
    assert not result.passed and "Operation not permitted" in result.stderr, result.stderr[-300:]
    with pytest.raises(socket.timeout):
        receiver.recv(10)
    receiver.close()


def test_a_program_cannot_leave_its_process_group_to_outlive_a_timeout():
    """Clearing the parent-death signal and moving to a group of its own would let a sleeping program miss
    the timeout's kill: both are refused, and nothing is left after the timeout."""
    code = ("import ctypes, os, time\nprint(os.getcwd(), flush=True)\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\n"
            "try:\n    os.setpgid(0, 0)\nexcept OSError as e:\n    print('refused', e.errno, flush=True)\n"
            "time.sleep(60)\n")
    result = run_code(code, timeout_s=2, layers=tuple(n for n in ("seccomp", "landlock", "namespaces")
                                                      if sandbox_layers()[n]))
    assert result.timed_out and "refused 1" in result.stdout
    assert _processes_with_home(result.stdout.split()[0]) == []


def test_total_disk_use_is_bounded_by_the_namespaces_layer():
    code = "data = b'x' * (6 * 2**20)\nfor n in range(4):\n    open(f'f{n}', 'wb').write(data)\n"
    result = run_code(code, file_mb=16, layers=_needs("namespaces"))
    assert not result.passed and "No space left on device" in result.stderr, result.stderr[-300:]


def test_no_capabilities_are_left_with_no_layer_at_all():
    result = run_code("print([l for l in open('/proc/self/status') if l.startswith('CapEff')][0])", layers=())
    assert result.passed and result.stdout.split()[-1] == "0000000000000000"


def test_ordinary_programs_still_work_under_every_layer():
    """Input after the guard's marker, dataclasses in a solution under test, asyncio (a socketpair), logging,
    tracebacks, __file__."""
    cases = {
        "import sys\nprint(sys.stdin.buffer.read())": "b'1 2\\n3\\n'",
        "from __future__ import annotations\nimport dataclasses\n@dataclasses.dataclass\nclass P:\n"
        "    x: int\nprint(P(1))": "P(x=1)",
        "import asyncio\nasync def f():\n    await asyncio.sleep(0.01)\n    return 3\nprint(asyncio.run(f()))": "3",
        "import logging, traceback\nlogging.getLogger('x').warning('w')\ntry:\n    1/0\nexcept Exception:\n"
        "    traceback.print_exc()\nprint(__file__.endswith('main.py'))": "True",
    }
    for code, expected in cases.items():
        result = run_code(code, stdin="1 2\n3\n", as_main=False)
        assert result.passed and result.stdout.strip() == expected, (code, result.stderr[-300:])


# Raw syscalls (x86_64 numbers; skipped elsewhere) the filter must refuse with EPERM, and what each would do.
_REFUSED_SYSCALLS = {
    "SysV shared memory (memory past RLIMIT_AS that outlives the call)": "sc(29, 0, 1 << 20, 0o1600)",
    "a SysV message queue": "sc(68, 0, 0o1600)",
    "a keyring entry (a channel between calls)": "sc(248, b'user', b'k', b'v', 1, -4)",
    "file_setattr (inode flags of a file it may not write)": "sc(469, -100, b'/', bytes(24), 24, 0)",
    "FS_IOC_SETFLAGS on a readable file": "sc(16, os.open(os.__file__, os.O_RDONLY), 0x40086602, bytes(8))",
    "flock on a file of the interpreter's": "sc(73, os.open(os.__file__, os.O_RDONLY), 2)",
    "inotify (names in folders it may not read)": "sc(294, 0)",
    "prlimit64 of another process": "sc(302, os.getppid() or 1, 7, None, bytes(16))",
    "setpriority": "sc(141, 0, 0, 5)",
}


@pytest.mark.parametrize("route", sorted(_REFUSED_SYSCALLS))
def test_the_filter_refuses_state_channels_and_effects_on_others(route):
    if os.uname().machine != "x86_64":
        pytest.skip("the raw syscall numbers here are x86_64's")
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nsc = libc.syscall\n"
            f"result = {_REFUSED_SYSCALLS[route]}\nprint(result, ctypes.get_errno())\n")
    result = run_code(code, layers=_needs("seccomp"))
    assert result.passed and result.stdout.split() == ["-1", "1"], (route, result.stdout, result.stderr[-300:])


def test_the_verdict_cannot_be_changed_by_patching_what_the_guard_calls():
    """The guard binds os._exit, os.write and the traceback printer before the program runs: replacing them
    does not turn a failing assert into a pass, and the hook's rules are not read from its module's globals."""
    from verl_hf.rewards import code_reward

    hack = "```python\nimport os, traceback\nos._exit = lambda code: None\ntraceback.print_exc = print\n" \
           "def add(a, b):\n    return 0\n```"
    assert code_reward()(["p"], [hack], [[1]], tests=[["assert add(1, 2) == 3"]]) == [0.0]
    neuter = "import sys, gc\nsys._getframe(1).f_globals['_BLOCKED_EVENTS'] = frozenset()\ngc.get_objects()"
    result = run_code(neuter)
    assert not result.passed and "gc.get_objects is blocked" in result.stderr


def test_output_threads_and_odd_programs_are_handled():
    """stdout survives a failure; threads the program started finish before the verdict; a folder nested
    1,200 deep is still removed; a lone surrogate in the code is the program's error, not the trainer's;
    open files are capped (each socketpair holds kernel memory)."""
    failing = run_code("print('partial')\nraise ValueError('boom')")
    assert not failing.passed and failing.stdout.strip() == "partial"
    threaded = run_code("import threading, time\ndef late():\n    time.sleep(0.2)\n    print('late')\n"
                        "threading.Thread(target=late).start()\n")
    assert threaded.passed and threaded.stdout.strip() == "late"
    deep = "import os\nprint(os.getcwd())\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\n"
    nested = run_code(deep, layers=tuple(n for n in ("seccomp", "landlock") if sandbox_layers()[n]))
    assert nested.passed and not os.path.exists(os.path.dirname(nested.stdout.split()[0]))
    assert not run_code("x = '\udc80'").passed
    many = run_code("import socket\npairs = [socket.socketpair() for _ in range(300)]")
    assert not many.passed and "Too many open files" in many.stderr
