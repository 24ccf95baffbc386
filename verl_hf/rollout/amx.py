"""Permission to use Intel AMX, asked for in every process that runs vLLM on a CPU.

Linux (5.16 and later) lets a process execute AMX tile instructions (Intel Sapphire Rapids and later:
`amx_tile` among the CPU flags) only after the process has asked for it, with
`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (the kernel's Documentation/arch/x86/xstate.rst); until
then the first tile instruction kills the process with SIGILL. oneDNN asks on its first bf16 matmul, but
vLLM's CPU attention kernel (`cpu_attention_with_kv_cache`, bf16) uses AMX without asking: a fresh process
whose first bf16 work is vLLM's warm-up dies with "Illegal instruction" (exit code 132). The permission is
per process, inherited by fork and cleared by exec (measured), so it is asked for where each vLLM process
starts: by `VLLMEngine` in the training processes (colocated, tensor-parallel ranks), by `verl-hf
vllm-serve` before the server starts, and by our vLLM plugin (`vllm_plugin`, loaded by vLLM in each of its
own processes: the server's API and engine processes, its workers). PyTorch has a private equivalent
(`torch.cpu._init_amx`); ours reports the kernel's reason when it refuses.

See it work: tests/test_amx.py.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform

from .vllm_version import guarded_plugin

ARCH_GET_XCOMP_PERM, ARCH_REQ_XCOMP_PERM = 0x1022, 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64 Linux

# What each errno of ARCH_REQ_XCOMP_PERM means (xstate.rst), for the error message.
REFUSALS = {
    "ENOSPC": "an alternate signal stack of a thread in this process (sigaltstack) is too small for the AMX "
              "state; enlarge or remove it",
    "EPERM": "the kernel's or the container's policy forbids AMX for this process",
}


def cpu_has_amx() -> bool:
    """True on x86_64 Linux when the CPU (and the kernel) report AMX tiles (`amx_tile` in /proc/cpuinfo)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return False
    return "amx_tile" in flags.split()


# vLLM 0.32's CPU attention takes its AMX kernel for bf16 only (v1/attention/backends/cpu_attn.py); 'auto' may
# resolve to bf16 (an fp32 checkpoint is downcast on a CPU with bf16).
NEEDS_AMX = ("bfloat16", "auto")


@functools.cache
def _syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall


def _arch_prctl(code: int, arg) -> int:
    """0, or the errno of `arch_prctl(code, arg)`; EINVAL off x86_64 Linux (158 is another call elsewhere)."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return errno.EINVAL
    return 0 if _syscall()(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), arg) == 0 else ctypes.get_errno()


def amx_permitted() -> bool:
    """True when this process may execute AMX tile instructions now."""
    mask = ctypes.c_ulong(0)
    return _arch_prctl(ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) == 0 and bool(mask.value >> XFEATURE_XTILEDATA & 1)


def request_amx() -> str | None:
    """Ask the kernel for AMX in this process. None: AMX is usable now, or there is none to ask for (no AMX in
    the CPU, or a kernel without AMX support: EINVAL, and then nothing can use it); otherwise the kernel's reason
    for refusing, in words."""
    if not cpu_has_amx() or amx_permitted():
        return None
    code = _arch_prctl(ARCH_REQ_XCOMP_PERM, ctypes.c_long(XFEATURE_XTILEDATA))
    if code == errno.EINVAL or (code == 0 and amx_permitted()):
        return None
    why = os.strerror(code) if code else "granted, but not in effect"
    return REFUSALS.get(errno.errorcode.get(code, ""), f"arch_prctl(ARCH_REQ_XCOMP_PERM): {why}")


def require_amx_for(dtype: str, fix: str) -> None:
    """Before vLLM starts in this process with weights of `dtype` ('bfloat16', 'float32', 'auto', ...): ask for
    AMX; if the kernel refuses and vLLM would take its AMX kernels (NEEDS_AMX), raise with the reason and `fix`
    instead of letting vLLM die with SIGILL."""
    reason = request_amx()
    if reason is not None and dtype in NEEDS_AMX:
        raise RuntimeError(f"this CPU has Intel AMX, but the kernel refused this process permission to use it "
                           f"({reason}). vLLM's CPU attention in bf16 would kill the process with 'Illegal "
                           f"instruction'. {fix}")


def plugin_missing() -> str | None:
    """Why our vLLM plugin would not load in the processes vLLM starts (None: it will): it is what asks for
    AMX there, the permission of the process that starts them being cleared by exec."""
    from importlib.metadata import entry_points

    names = {entry.name for entry in entry_points(group="vllm.general_plugins")}
    if "verl_hf_cpu_amx" not in names:
        return "verl_hf's vLLM plugin verl_hf_cpu_amx is not installed (an install from before it): reinstall " \
               "verl_hf (`pip install -e .` in a clone)"
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and "verl_hf_cpu_amx" not in allowed.split(","):
        return f"VLLM_PLUGINS={allowed!r} leaves out verl_hf_cpu_amx: add it (comma-separated)"
    return None


@guarded_plugin(version_gated=False)  # a syscall: the same on any vLLM
def vllm_plugin() -> None:
    """vLLM general plugin (setup.cfg entry point): ask for AMX in each process vLLM starts. A refusal is
    reported and left to the dtype check of whoever started vLLM (`verl-hf vllm-serve`, VLLMEngine): fp32 runs
    without AMX."""
    reason = request_amx()
    if reason is not None:
        import logging

        logging.getLogger(__name__).warning("verl_hf: Intel AMX refused in this vLLM process (%s); bf16 attention "
                                            "would die with 'Illegal instruction': run it in float32.", reason)
