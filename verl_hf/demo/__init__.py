"""The embedded demos: tiny Llamas, tokenizers built locally, and synthetic arithmetic tasks.

Nothing here touches the network. `verl-hf demo` (verl_hf/runner.py) loads the shipped warm-start checkpoint
(`warm_start/`, built by `sft.py`) and trains it with GRPO on addition; `verl-hf demo --task tools` loads
`warm_start_tools/` (built by `sft.py --task tools`) and trains it to multiply with a tool (tools_task.py);
`--task tools-qwen3` and `--task tools-mistral` do the same on a tiny Qwen3 (thinking on) and a tiny Mistral,
each in its own tool format (families.py). `--task vision` loads `warm_start_vision/` (a tiny Qwen2-VL, built by
`sft.py --task vision`) and trains it to name the color of a drawn shape (vision_task.py).

See it work: `make demo`, or tests/test_demo_task.py.
"""

from .task import make_addition_dataset
from .tiny import build_char_tokenizer, build_tiny_llama

WARM_START_DIR = __import__("pathlib").Path(__file__).parent / "warm_start"
TOOLS_WARM_START_DIR = WARM_START_DIR.parent / "warm_start_tools"  # the tool demo's (tools_task.py, sft_tools.py)
# The tool demo in another family's format (families.py): `sft.py --task tools --family qwen3|mistral`
FAMILY_WARM_START_DIRS = {name: WARM_START_DIR.parent / f"warm_start_tools_{name}" for name in ("qwen3", "mistral")}
VISION_WARM_START_DIR = WARM_START_DIR.parent / "warm_start_vision"  # the vision demo's (vision_task.py, sft_vision.py)

__all__ = ["FAMILY_WARM_START_DIRS", "TOOLS_WARM_START_DIR", "VISION_WARM_START_DIR", "WARM_START_DIR", "build_char_tokenizer", "build_tiny_llama",
           "make_addition_dataset"]
