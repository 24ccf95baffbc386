"""The embedded default: a tiny Llama, a character tokenizer built locally, and a synthetic arithmetic task.

Nothing here touches the network. `verl-hf demo` (see `run.py`) loads the shipped warm-start checkpoint
(`warm_start/`, built by `sft.py`) and trains it with GRPO.

See it work: `make demo`, or tests/test_demo_task.py.
"""

from .task import make_addition_dataset
from .tiny import build_char_tokenizer, build_tiny_llama

WARM_START_DIR = __import__("pathlib").Path(__file__).parent / "warm_start"

__all__ = ["WARM_START_DIR", "build_char_tokenizer", "build_tiny_llama", "make_addition_dataset"]
