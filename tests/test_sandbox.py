"""The code sandbox: generated code runs in a limited subprocess, never in the trainer's process."""

import os
import socket
import subprocess
import sys
import threading
import time

from verl_hf.rewards.sandbox import network_namespace_available, run_code


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


def test_the_network_namespace_layer_alone_has_no_route():
    """Beneath the audit hook, where the kernel allows it, the program has a network namespace of its own."""
    if not network_namespace_available():
        return  # the audit hook is then the only layer (checked above)
    code = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\nexcept OSError as e:\n" \
           "    print('unreachable', e)\n"
    out = subprocess.run(["unshare", "-rn", sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "unreachable" in out.stdout


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
