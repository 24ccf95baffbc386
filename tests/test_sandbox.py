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
    assert not result.passed and "writing outside the working directory is blocked" in result.stderr
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
