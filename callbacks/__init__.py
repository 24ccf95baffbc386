"""verl_hf's `TrainerCallback`s, importable as `verl_hf.callbacks` (setup.cfg maps this folder there).

See it work: tests/test_callbacks.py.
"""

from .progress import RLProgressCallback

__all__ = ["RLProgressCallback"]
