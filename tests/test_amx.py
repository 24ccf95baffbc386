"""Intel AMX for vLLM's CPU kernels (verl_hf/rollout/amx.py), against the real kernel: a fresh process may not
use AMX until it asks, exec clears the permission (why every vLLM process asks through our plugin), and a real
refusal (a thread's alternate signal stack too small for the AMX state: the kernel answers ENOSPC) stops
VLLMEngine and `verl-hf vllm-serve` with the reason and the fix instead of a SIGILL. That bf16 vLLM now starts
in a fresh process, colocated and as a server, is tested by tests/test_architectures.py (the default-precision
column and test_vllm_server_in_the_default_precision). Each check runs in a process of its own: the permission
cannot be taken back once granted."""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from verl_hf.rollout import amx
from verl_hf.rollout.amx import cpu_has_amx

needs_amx = pytest.mark.skipif(not cpu_has_amx(), reason="this CPU has no AMX tiles (amx_tile): nothing to ask for")

# Installs an alternate signal stack of 4 KiB in the main thread: enough without AMX, too small with it, so the
# kernel refuses ARCH_REQ_XCOMP_PERM with ENOSPC (Documentation/arch/x86/xstate.rst).
SMALL_SIGALTSTACK = """
import ctypes
class Stack(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]
buffer = ctypes.create_string_buffer(4096)
assert ctypes.CDLL(None).sigaltstack(ctypes.byref(Stack(ctypes.cast(buffer, ctypes.c_void_p), 0, 4096)), None) == 0
"""


# The module by its path: it needs the standard library only, and importing verl_hf takes seconds.
LOAD_AMX = f"import runpy; amx = runpy.run_path({amx.__file__!r})\n"


def run(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


@needs_amx
def test_a_fresh_process_may_use_amx_only_after_asking_and_exec_forgets_it():
    done = run(LOAD_AMX + f"""
import json, subprocess, sys
before = amx["amx_permitted"]()
reason = amx["request_amx"]()
after = amx["amx_permitted"]()
child = subprocess.run([sys.executable, "-c", {LOAD_AMX!r} + "print(amx['amx_permitted']())"], capture_output=True,
                       text=True).stdout
print(json.dumps([before, reason, after, child.strip()]))
""")
    assert json.loads(done.stdout.splitlines()[-1]) == [False, None, True, "False"]


@needs_amx
def test_our_vllm_plugin_asks_for_amx_in_each_vllm_process():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("verl_hf_cpu_amx") == "verl_hf.rollout.amx:vllm_plugin", plugins
    done = run(LOAD_AMX + "amx['vllm_plugin'](); print(amx['amx_permitted']())")
    assert done.returncode == 0 and done.stdout.split()[-1] == "True", done.stderr[-3000:]


@needs_amx
def test_a_refused_permission_names_the_reason_and_the_fix(tmp_path):
    """A real refusal (ENOSPC), then: fp32 goes on (vLLM's fp32 kernels need no AMX); VLLMEngine in bf16 and
    `verl-hf vllm-serve` at its default dtype stop before vLLM starts, naming the cause and the float32 fix."""
    model = tmp_path / "config"
    model.mkdir()
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=64, max_position_embeddings=64).save_pretrained(model)
    done = run(SMALL_SIGALTSTACK + f"""
import json, torch
from transformers import AutoConfig
from verl_hf.rollout.amx import request_amx, require_amx_for
from verl_hf.rollout.vllm_engine import VLLMEngine
from verl_hf.rollout.vllm_serve import main as serve
figures = {{"reason": request_amx()}}
require_amx_for("float32", "unused")  # no error: fp32 does not need AMX
try:
    VLLMEngine(AutoConfig.from_pretrained({str(model)!r}), 0, [1], max_model_len=32, dtype=torch.bfloat16)
except RuntimeError as e:
    figures["engine"] = str(e)
try:
    serve([{str(model)!r}, "--port", "1"])
except SystemExit as e:
    figures["serve"] = str(e)
print(json.dumps(figures))
""")
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    assert "sigaltstack" in figures["reason"], figures
    assert "Illegal instruction" in figures["engine"] and "rollout_dtype='float32'" in figures["engine"], figures
    assert "sigaltstack" in figures["serve"] and "--dtype float32" in figures["serve"], figures


def test_serve_reads_the_dtype_passed_on_to_vllm():
    from verl_hf.rollout.vllm_serve import passthrough_value

    assert passthrough_value(["--dtype", "float32", "--seed", "1"], "--dtype") == "float32"
    assert passthrough_value(["--seed=1", "--dtype=bfloat16"], "--dtype") == "bfloat16"
    assert passthrough_value(["--seed", "1"], "--dtype") is None
    assert passthrough_value(["--dtype", "float32", "--dtype=bfloat16"], "--dtype") == "bfloat16"  # the last wins


# What the kernel answers, set by hand (these run on every CPU kind; the tests above ask the real kernel where
# it has AMX): how each answer turns into an error, or into nothing to do.
@pytest.fixture()
def kernel(monkeypatch):
    answers = {"cpu_has_amx": True, "permitted": False, "errno": 0}
    monkeypatch.setattr(amx, "cpu_has_amx", lambda: answers["cpu_has_amx"])
    monkeypatch.setattr(amx, "amx_permitted", lambda: answers["permitted"])
    monkeypatch.setattr(amx, "_arch_prctl", lambda code, arg: answers["errno"])
    return answers


def test_each_refusal_is_named_and_only_bf16_is_stopped(kernel):
    import errno

    kernel["errno"] = errno.ENOSPC
    assert "sigaltstack" in amx.request_amx()
    for dtype in ("bfloat16", "auto"):  # vLLM's AMX attention is bf16; 'auto' may resolve to it
        with pytest.raises(RuntimeError, match=r"refused .*sigaltstack.*'Illegal instruction'. THE FIX"):
            amx.require_amx_for(dtype, "THE FIX")
    for dtype in ("float32", "float16"):  # no AMX kernel in vLLM's CPU attention for these
        amx.require_amx_for(dtype, "THE FIX")
    kernel["errno"] = errno.EPERM
    assert "policy" in amx.request_amx()
    kernel["errno"] = errno.EINVAL  # a kernel without AMX support: nothing can use it, nothing to ask for
    assert amx.request_amx() is None
    kernel["cpu_has_amx"] = False
    assert amx.request_amx() is None


def test_serve_needs_our_plugin_where_bf16_would_use_amx(kernel, monkeypatch):
    from verl_hf.rollout import vllm_serve

    kernel["permitted"] = True
    monkeypatch.setattr(vllm_serve, "cpu_has_amx", lambda: True)
    monkeypatch.setenv("VLLM_PLUGINS", "verl_hf_weight_transfer")
    with pytest.raises(SystemExit, match=r"leaves out verl_hf_cpu_amx: add it.*--dtype float32"):
        vllm_serve.check_amx("auto")
    vllm_serve.check_amx("float32")  # fp32 needs no AMX
    monkeypatch.setenv("VLLM_PLUGINS", "verl_hf_weight_transfer,verl_hf_cpu_amx")
    vllm_serve.check_amx("bfloat16")
