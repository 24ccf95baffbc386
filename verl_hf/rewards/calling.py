"""Calling reward functions: sync or async, all async ones of a batch concurrently, and what a raised
exception becomes.

A function is called once on the whole batch. If that call raises, the batch is re-run one sample at a time to
find the samples that fail: with `on_error="raise"` the error names the function and the first failing
sample's index; with `on_error="zero"` those samples score 0.0 and are counted (`reward/<name>/errors`).

See it work: tests/test_rewards_calling.py.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Callable

ON_ERROR = ("raise", "zero")


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _reward_loop() -> asyncio.AbstractEventLoop:
    """One event loop for every async reward call of the process, running on a daemon thread: clients that
    async reward functions create once (httpx, AsyncOpenAI) stay bound to it across batches, and it works
    the same inside a running loop (Jupyter), which cannot be re-entered."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="verl_hf-rewards", daemon=True).start()
        return _LOOP


def run_coroutines(coroutines: list) -> list:
    """Results (or raised exceptions) of `coroutines`, run concurrently on the reward loop."""
    if not coroutines:
        return []

    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(gather(), _reward_loop()).result()


def call_all(reward_funcs: list[tuple[str, Callable]], batch: dict) -> list:
    """Each function's output (or the exception it raised) on `batch` (keyword arguments): sync functions in
    turn, then every async one concurrently."""
    outputs, pending = [], {}
    for j, (_, func) in enumerate(reward_funcs):
        try:
            out = func(**batch)
        except Exception as exc:  # noqa: BLE001 - handled by the caller, with the function's name
            out = exc
        if inspect.isawaitable(out):
            pending[j] = out
        outputs.append(out)
    for j, result in zip(pending, run_coroutines(list(pending.values()))):
        outputs[j] = result
    return outputs


def per_sample(func: Callable, batch: dict, n: int) -> list:
    """`func`'s output (or exception) for each sample alone; async calls run concurrently."""
    results = []
    for i in range(n):
        try:
            results.append(func(**{k: v[i : i + 1] for k, v in batch.items()}))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)
    awaiting = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
    for i, r in zip(awaiting, run_coroutines([results[i] for i in awaiting])):
        results[i] = r
    return results


def recover(name: str, func: Callable, batch: dict, n: int, error: Exception, on_error: str) -> list:
    """After `func` raised `error` on the whole batch: its one-sample outputs, with None where a sample fails
    (on_error='zero'); with on_error='raise', an error naming the first failing sample."""
    results = per_sample(func, batch, n)
    failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
    if on_error == "zero":
        return [None if isinstance(r, Exception) else r for r in results]
    if not failed:
        raise RuntimeError(f"reward function {name!r} raised on the whole batch of {n}, though each sample alone "
                           f"passes: {type(error).__name__}: {error}") from error
    index, exc = failed[0], results[failed[0]]
    prompt = str(batch["prompts"][index])[:80]
    raise RuntimeError(f"reward function {name!r} raised on sample {index} of {n} ({len(failed)} fail; prompt "
                       f"{prompt!r}): {type(exc).__name__}: {exc}. Fix the function, or set reward_on_error='zero' "
                       f"to score failing samples 0 and count them (reward/{name}/errors).") from exc
