"""The sandbox's child side: run as a script (`python -I -B sandbox_child.py ...`) by `sandbox.run_code`, never
imported by the trainer. It installs the layers it is told to, then runs the program from its working directory.

Order matters: everything the child needs is read first, then the limits and the kernel's filters go on, and
none of them can be lifted afterwards (capabilities dropped, no_new_privs, seccomp and Landlock are one-way;
the rlimits' hard values are lowered, and raising one needs a capability the process no longer has).

- namespaces (set up by `unshare` in the parent's command): this process is PID 1 of its own PID namespace;
  it forks the program's process and waits, so that when either ends every process in the namespace is
  killed. Its working directory becomes a tmpfs of `file_size` bytes (total disk use bounded).
- capabilities: all dropped (root, or root of its user namespace, keeps its uid but no privilege).
- seccomp: refuses (EPERM) execve, every way to make a process (fork, vfork, clone without CLONE_THREAD;
  clone3, whose flags a filter cannot read, gets ENOSYS so that the C library falls back to clone for
  threads), leaving the process group or session, clearing the parent-death signal, sockets other than a
  socketpair (socket, connect, bind, sendmsg, sendto with an address), io_uring, memfd (memory outside the
  address-space limit), changes to files' metadata (modes, owners, times, extended attributes), namespaces,
  mounts, ptrace and kernel modules. Any other syscall ABI (i386 `int 0x80`, x32) kills the process.
- Landlock: reads only under the interpreter's own folders (its sys.path under the Python installation, the
  system's library folders, the loader's cache), writes only under the working directory, no execution of
  any file; with ABI >= 4 no TCP bind/connect; with ABI >= 6 no signals to, and no abstract unix sockets of,
  processes outside the sandbox.
- the audit hook: the same rules at the Python level, with messages that say what was refused, and no
  introspection that reaches the guard (the garbage collector's object lists, other threads' frames,
  tracing, replacing the guard's code).
"""

import ctypes
import os
import platform
import resource
import struct
import sys
import threading
import traceback
import types

_libc = ctypes.CDLL(None, use_errno=True)
_X86_64, _AARCH64 = 0xC000003E, 0xC00000B7
_MAIN_THREAD = threading.get_ident()
_MAX_OPEN_FILES = 256  # each open socketpair or pipe holds kernel memory that RLIMIT_AS does not count


def _fail(what: str) -> None:
    raise OSError(ctypes.get_errno(), f"sandbox: could not {what}")


# ------------------------------------------------------------------------------------------------ seccomp
# Syscalls refused outright, by name: (x86_64, aarch64) numbers; None where the machine has no such call.
_REFUSED = {
    "execve": (59, 221), "execveat": (322, 281), "fork": (57, None), "vfork": (58, None),
    "setpgid": (109, 154), "setsid": (112, 157),
    "socket": (41, 198), "connect": (42, 203), "bind": (49, 200), "sendmsg": (46, 211), "sendmmsg": (307, 269),
    "io_uring_setup": (425, 425), "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452),
    "chown": (92, None), "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54),
    "utime": (132, None), "utimes": (235, None), "utimensat": (280, 88), "futimesat": (261, None),
    "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "setxattrat": (463, 463),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16), "removexattrat": (466, 466),
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "init_module": (175, 105),
    "finit_module": (313, 273), "file_setattr": (469, 469),
    # State that would outlive the program, or a channel between programs: SysV IPC, POSIX queues, keyrings.
    "shmget": (29, 194), "msgget": (68, 186), "semget": (64, 190), "mq_open": (240, 180),
    "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    # Watching or locking what the program may not read or own: inotify, flock.
    "inotify_init": (253, None), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27), "flock": (73, 32),
    # Scheduling another process, or this one, differently.
    "setpriority": (141, 140), "sched_setparam": (142, 118), "sched_setscheduler": (144, 119),
    "sched_setaffinity": (203, 122), "sched_setattr": (314, 274), "ioprio_set": (251, 30),
    "migrate_pages": (256, 238), "move_pages": (279, 239),
}
# Syscalls refused by an argument's value: clone without CLONE_THREAD, prctl(PR_SET_PDEATHSIG), sendto with an
# address, prlimit64 of another process, fcntl(F_SETLEASE), ioctl setting inode flags (FS_IOC_SETFLAGS,
# FS_IOC_FSSETXATTR: append-only, immutable and the like, which Landlock's ioctl right does not cover).
_CLONE, _CLONE3, _PRCTL, _SENDTO, _PRLIMIT, _FCNTL, _IOCTL = {
    "x86_64": (56, 435, 157, 44, 302, 72, 16), "aarch64": (220, 435, 167, 206, 261, 25, 29)}.get(
    platform.machine(), (None,) * 7)
_CLONE_THREAD, _PR_SET_PDEATHSIG, _F_SETLEASE = 0x00010000, 1, 1024
_FS_IOC_SETFLAGS, _FS_IOC_FSSETXATTR = 0x40086602, 0x401C5820
_RET_ALLOW, _RET_EPERM, _RET_ENOSYS, _RET_KILL = 0x7FFF0000, 0x00050001, 0x00050026, 0x80000000
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _assemble(program: list[tuple]) -> bytes:
    """Classic BPF from (code, true label, false label, k) rows and ("label",) rows; jumps go forward only."""
    labels, rows = {}, []
    for row in program:
        if len(row) == 1:
            labels[row[0]] = len(rows)
        else:
            rows.append(row)
    raw = b""
    for i, (code, true, false, k) in enumerate(rows):
        offset = [0 if target is None else labels[target] - i - 1 for target in (true, false)]
        raw += struct.pack("HBBI", code, offset[0], offset[1], k)
    return raw


def seccomp_program() -> bytes:
    """The filter described in the module docstring, for this machine (x86_64 or aarch64)."""
    x86 = platform.machine() == "x86_64"
    refused = sorted({numbers[0 if x86 else 1] for numbers in _REFUSED.values()} - {None})
    program = [(_LD, None, None, 4), (_JEQ, None, "kill", _X86_64 if x86 else _AARCH64), (_LD, None, None, 0)]
    if x86:
        program.append((_JGE, "kill", None, 0x40000000))  # the x32 ABI's numbers
    program += [(_JEQ, "eperm", None, n) for n in refused]
    program += [(_JEQ, "enosys", None, _CLONE3), (_JEQ, "clone", None, _CLONE), (_JEQ, "prctl", None, _PRCTL),
                (_JEQ, "sendto", None, _SENDTO), (_JEQ, "prlimit", None, _PRLIMIT), (_JEQ, "fcntl", None, _FCNTL),
                (_JEQ, "ioctl", "allow", _IOCTL),
                ("clone",), (_LD, None, None, 16), (_JSET, "allow", "eperm", _CLONE_THREAD),  # args[0], low half
                ("prctl",), (_LD, None, None, 16), (_JEQ, "eperm", "allow", _PR_SET_PDEATHSIG),
                ("sendto",), (_LD, None, None, 48), (_JEQ, None, "eperm", 0),  # args[4], the address: NULL only
                (_LD, None, None, 52), (_JEQ, "allow", "eperm", 0),
                ("prlimit",), (_LD, None, None, 16), (_JEQ, None, "eperm", 0),  # args[0], the pid: 0 (itself) only
                (_LD, None, None, 20), (_JEQ, "allow", "eperm", 0),
                ("fcntl",), (_LD, None, None, 24), (_JEQ, "eperm", "allow", _F_SETLEASE),  # args[1], the command
                ("ioctl",), (_LD, None, None, 24), (_JEQ, "eperm", None, _FS_IOC_SETFLAGS),  # args[1], the request
                (_JEQ, "eperm", "allow", _FS_IOC_FSSETXATTR),
                ("allow",), (_RET, None, None, _RET_ALLOW), ("eperm",), (_RET, None, None, _RET_EPERM),
                ("enosys",), (_RET, None, None, _RET_ENOSYS), ("kill",), (_RET, None, None, _RET_KILL)]
    return _assemble(program)


def install_seccomp() -> None:
    raw = seccomp_program()
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("HxxxxxxQ" if struct.calcsize("P") == 8 else "HxxI", len(raw) // 8, ctypes.addressof(buffer))
    if _libc.prctl(38, 1, 0, 0, 0) or _libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0):  # NO_NEW_PRIVS; FILTER
        _fail("install the seccomp filter")


# ----------------------------------------------------------------------------------------------- Landlock
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446  # the same on every arch
# Landlock's filesystem rights, in ABI order (bit i is right i); ABI 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_CHAR, _MAKE_BLOCK, _IOCTL_DEV = 1 << 6, 1 << 11, 1 << 15
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14) | _IOCTL_DEV  # the rights a rule on a file may hold


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (or it is disabled)."""
    version = _libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(version, 0)


def readable_paths() -> list[str]:
    """What the interpreter reads after start-up: its import path, the shared libraries' folders and the
    loader's cache. Nothing of the user's (home, the trainer's data and outputs) unless the trainer's own
    Python lives there."""
    homes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, "/usr/")}
    # Not every sys.path entry: an editable install puts a source checkout there, beside the user's outputs.
    paths = {p for p in sys.path if p and any(os.path.realpath(p).startswith(h) for h in homes)}
    paths |= {"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache"}
    with open("/proc/self/maps") as maps:  # the folders of the libraries already loaded (a Python built elsewhere)
        paths |= {os.path.dirname(line.split()[-1]) for line in maps if line.rstrip().endswith(".so")
                  or ".so." in line.rsplit("/", 1)[-1]}
    return sorted(p for p in paths if os.path.exists(p))


def install_landlock(workdir: str, abi: int) -> None:
    """Restrict this process (and anything it could start) to the rules in the module docstring. No rule
    grants EXECUTE: loading a shared library maps it, which Landlock leaves alone, so only execve is denied."""
    fs = _FS_RIGHTS[min(abi, 5)]
    net = 0b11 if abi >= 4 else 0  # BIND_TCP | CONNECT_TCP: none allowed
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL: the sandbox's own only
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _libc.syscall(_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        _fail("create the Landlock ruleset")
    rules = [(p, (_READ_FILE | _READ_DIR) & fs) for p in readable_paths()]
    rules += [(workdir, fs & ~(_EXECUTE | _MAKE_CHAR | _MAKE_BLOCK | _IOCTL_DEV)),
              ("/dev/null", (_READ_FILE | _WRITE_FILE) & fs), ("/dev/urandom", _READ_FILE), ("/dev/zero", _READ_FILE)]
    for path, rights in rules:
        if not os.path.exists(path):
            continue
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = struct.pack("=Qi", rights if os.path.isdir(path) else rights & _FILE_RIGHTS, fd)  # packed struct
            if _libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0):
                _fail(f"add the Landlock rule for {path}")
        finally:
            os.close(fd)
    if _libc.prctl(38, 1, 0, 0, 0) or _libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0):
        _fail("enforce the Landlock ruleset")
    os.close(ruleset)


# ------------------------------------------------------------------------------ namespaces and privileges
def reap_as_pid_one() -> None:
    """In a PID namespace of its own this process is PID 1: fork the program's process, wait for it, and exit
    with its status. The namespace, and every process in it, ends with PID 1, which the program cannot
    reach (it is not the program's process, and PID 1 ignores signals it has no handler for)."""
    if os.getpid() != 1:
        return
    child = os.fork()
    if child == 0:
        return
    while True:
        pid, status = os.wait()
        if pid == child:
            os._exit(os.waitstatus_to_exitcode(status) % 256)


def own_tmpfs(workdir: str, size: int) -> None:
    """Mount a tmpfs of `size` bytes on the working directory (this mount namespace only) and move the
    program's file onto it: the program's total disk use is bounded, not only each file's."""
    source = open(os.path.join(workdir, "main.py"), "rb").read()
    options = f"size={size},nr_inodes=4096,mode=0700".encode()
    if _libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", 2 | 4 | 8, options):  # MS_NOSUID | MS_NODEV | MS_NOEXEC
        _fail(f"mount a tmpfs on {workdir}")
    os.chdir(workdir)  # onto the new mount
    with open("main.py", "wb") as f:
        f.write(source)


def drop_capabilities() -> None:
    """No capability left, effective, permitted or inheritable: root (or the root of a user namespace) keeps
    its uid but cannot override permissions, raise limits, mount or load modules."""
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    if _libc.capset(header, bytes(24)):
        _fail("drop capabilities")


# ----------------------------------------------------------------------------------------------- the hook
_BLOCKED_EVENTS = frozenset((
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
    "ctypes.dlopen", "ctypes.dlsym", "sys.addaudithook", "os.kill", "os.killpg", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys._current_exceptions"))
_CHANGES = frozenset(("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                      "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def audit_hook(workdir: str, unix_pairs: bool):
    """The Python-level guard: sockets (but for asyncio's socketpair where the kernel filter refuses every
    other socket: `unix_pairs`), new processes, signals, native libraries, introspection that reaches the
    guard, and writes (or directory handles) outside `workdir` raise PermissionError saying what was refused."""
    realpath, fsdecode, isdir = os.path.realpath, os.fsdecode, os.path.isdir
    prefix, blocked, changes, write_flags = workdir + os.sep, _BLOCKED_EVENTS, _CHANGES, _WRITE_FLAGS

    def inside(path) -> bool:
        if isinstance(path, int):
            return True
        real = realpath(fsdecode(path))
        return real == workdir or real.startswith(prefix) or real == "/dev/null"

    def guard(event, args):
        if event.startswith("socket."):
            if not (unix_pairs and event == "socket.__new__" and args[1] == 1):  # AF_UNIX, made by socketpair
                raise PermissionError(f"sandbox: network access is blocked ({event})")
        elif event in blocked:
            raise PermissionError(f"sandbox: {event} is blocked")
        elif event == "object.__setattr__" and args[1] == "__code__" and args[0] is guard:
            raise PermissionError("sandbox: replacing the guard's code is blocked")
        elif event == "open":
            path, mode, flags = args
            wants_write = any(c in mode for c in "wax+") if mode is not None else bool(flags & write_flags)
            if not inside(path) and (wants_write or isdir(fsdecode(path))):
                raise PermissionError(f"sandbox: writing (or a directory handle) outside the working directory "
                                      f"is blocked ({path})")
        elif event == "sqlite3.connect" and args[0] not in (":memory:", "") and not inside(args[0]):
            raise PermissionError(f"sandbox: a database outside the working directory is blocked ({args[0]})")
        elif event in changes and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise PermissionError(f"sandbox: {event} outside the working directory is blocked")

    return guard


# ------------------------------------------------------------------------------------------------ the run
def read_marker() -> str:
    """The one-time marker, first line of stdin, read byte by byte so that the program's stdin (sys.stdin,
    its buffer, fd 0) starts exactly after it."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    return line.decode().strip()


def run(source: bytes, marker: str, as_main: bool, _exit=os._exit, _write=os.write, _stdout=sys.stdout,
        _stderr=sys.stderr, _print_exc=traceback.print_exc, _threads=threading.enumerate) -> None:
    """Run the program as module `__main__` (or `__sandbox__`), registered in sys.modules like a script; print
    the marker only if it ran to its end, its non-daemon threads included. What this needs after the program
    has run is bound here, before it runs: a program that replaces os._exit or traceback.print_exc changes
    nothing of the verdict."""
    sys.argv = ["main.py"]
    module = types.ModuleType("__main__" if as_main else "__sandbox__")
    module.__file__, module.__builtins__ = os.path.abspath("main.py"), __builtins__
    sys.modules[module.__name__] = module
    code = compile(source, "main.py", "exec")
    status = 0
    try:
        exec(code, module.__dict__)
        for thread in _threads():  # as the interpreter does at exit: wait for the program's own threads
            if not thread.daemon and thread.ident != _MAIN_THREAD:
                thread.join()
    except SystemExit as stop:
        if not as_main or stop.code not in (None, 0):
            print(f"sandbox: the program exited early (SystemExit({stop.code!r}))", file=_stderr)
            status = stop.code if isinstance(stop.code, int) and stop.code else 1
    except BaseException:  # noqa: BLE001 - its traceback is the program's error message
        status = 1
        try:
            _print_exc(file=_stderr)
        except BaseException:  # noqa: BLE001 - a program may have broken the traceback module: still a failure
            pass
    for stream in (_stdout, _stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a program may close its own streams
            pass
    if status == 0:
        _write(1, f"\n{marker}\n".encode())
    _exit(status)  # no atexit handlers of the program after the verdict


def main(cpu_s: str, memory: str, file_size: str, as_main: str, layers: str) -> None:
    marker, chosen = read_marker(), set(layers.split(","))
    workdir = os.path.realpath(os.getcwd())
    if "namespaces" in chosen:
        reap_as_pid_one()
        own_tmpfs(workdir, int(file_size))
    source = open("main.py", "rb").read()
    for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_FSIZE, file_size), (resource.RLIMIT_NOFILE, _MAX_OPEN_FILES)):
        resource.setrlimit(limit, (int(value), int(value)))
    drop_capabilities()
    if "landlock" in chosen:
        install_landlock(workdir, landlock_abi())
    if "seccomp" in chosen:
        install_seccomp()
    if "audit" in chosen:
        sys.addaudithook(audit_hook(workdir, unix_pairs="seccomp" in chosen))
    globals().pop("_libc")  # the C library handle the guard used: not left where the program's frames can reach
    run(source, marker, as_main == "1")


if __name__ == "__main__":
    main(*sys.argv[1:6])
