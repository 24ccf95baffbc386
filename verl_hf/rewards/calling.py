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


def run_coroutines(coroutines: list):
    """Results of `coroutines`, run concurrently. Inside a running event loop (Jupyter) they run in a loop of
    their own on a helper thread, since a running loop cannot be re-entered."""
    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", asyncio.run(gather())))
    thread.start()
    thread.join()
    return box["out"]


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
        error.add_note(f"(raised inside reward function {name!r} on the whole batch; each sample alone passes)")
        raise error
    index, exc = failed[0], results[failed[0]]
    prompt = str(batch["prompts"][index])[:80]
    raise RuntimeError(f"reward function {name!r} raised on sample {index} of {n} ({len(failed)} fail; prompt "
                       f"{prompt!r}): {type(exc).__name__}: {exc}. Fix the function, or set reward_on_error='zero' "
                       f"to score failing samples 0 and count them (reward/{name}/errors).") from exc
