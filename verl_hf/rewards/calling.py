"""Calling reward functions: sync or async, all async ones of a batch concurrently, each call within a time
limit, and what a raised exception or a timeout becomes.

A function is called once on the whole batch. If that call raises or runs past `timeout_s`, the batch is re-run
one sample at a time (each within `timeout_s`; after two samples time out, the rest are not run) to find the
samples that fail: with `on_error="raise"`
the error names the function and the first failing sample's index; with `on_error="zero"` those samples score
0.0 and are counted (`reward/<name>/errors`).

Time limits: a sync function running in the main thread is interrupted by a signal (SIGUSR2, repeated each
second until it gives up), which stops Python code and blocking calls such as `time.sleep` or a socket read;
only a C extension that never returns to Python can outlast it. Off the main thread it runs in a worker thread
that is abandoned at the limit. An async function is cancelled; one that blocks the event loop itself gets the
loop abandoned and a fresh one for the next call.

See it work: tests/test_rewards_calling.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import signal
import threading
from typing import Callable

from .contract import form_hint

logger = logging.getLogger(__name__)
ON_ERROR = ("raise", "zero")
MAX_SAMPLE_TIMEOUTS = 2  # per-sample re-runs of a function that timed out on its batch stop after this many
_SIGNAL = signal.SIGUSR2  # not SIGALRM: reward code (math-verify) sets its own alarms; SIGUSR1: SLURM requeue


class _Expired(BaseException):
    """Raised inside a sync reward call at its deadline. A BaseException, so the function's own
    `except Exception` cannot swallow it; turned into RewardTimeout once the call is unwound."""


class RewardTimeout(TimeoutError):
    """A reward or cost function ran past its time limit; `blocked_loop`: an async one that stopped the event
    loop itself (blocking code inside `async def`)."""

    def __init__(self, message: str, blocked_loop: bool = False):
        super().__init__(message)
        self.blocked_loop = blocked_loop


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


def _abandon_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A coroutine blocked the loop's thread: the next call starts a fresh loop, and this one stops once the
    blocking code returns (if it ever does)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is loop:
            _LOOP = None
    loop.call_soon_threadsafe(loop.stop)


def run_coroutines(coroutines: list, timeout_s: float | None = None, names: list[str] | None = None,
                   setting: str = "reward_timeout_s") -> list:
    """Results (or raised exceptions, RewardTimeout past `timeout_s`) of `coroutines`, run concurrently on the
    reward loop. Each is cancelled at the limit; if the loop itself stops answering (blocking code inside
    `async def`), what has not finished a little later times out and the loop is abandoned. `setting`: the
    config field the timeout messages name."""
    if not coroutines:
        return []
    names = names or ["async reward function"] * len(coroutines)

    async def bounded(coroutine, name):
        limit = asyncio.timeout(timeout_s)
        try:
            async with limit:
                return await coroutine
        except TimeoutError:
            if limit.expired():  # ours; a TimeoutError of the function's own is its error, as raised
                raise RewardTimeout(_expired(name, timeout_s, setting)) from None
            raise

    loop = _reward_loop()
    futures = [asyncio.run_coroutine_threadsafe(bounded(c, name), loop) for c, name in zip(coroutines, names)]
    grace = None if timeout_s is None else timeout_s + min(timeout_s, 5.0)
    done, late = concurrent.futures.wait(futures, timeout=grace)
    if late:
        _abandon_loop(loop)
    blocked = (" It blocked the event loop (blocking code inside `async def`), so later calls run on a new loop:"
               " async clients created on the old one (httpx.AsyncClient, AsyncOpenAI) must be created again "
               "(per call, or keyed by asyncio.get_running_loop()).")
    return [_outcome(f, name) if f in done else RewardTimeout(_expired(name, timeout_s, setting) + blocked, True)
            for f, name in zip(futures, names)]


def _outcome(future, name: str):
    """A finished call's result, or its exception (a cancelled one as an error naming the function)."""
    if future.cancelled():
        return RuntimeError(f"{name!r} was cancelled (asyncio.CancelledError) before it returned.")
    return future.exception() or future.result()


@contextlib.contextmanager
def deadline(timeout_s: float | None):
    """Inside, the calling (main) thread is interrupted with `_Expired` once `timeout_s` has passed, then again
    every second until the block ends. Yields a one-item list that holds True once the deadline fired (a
    function may swallow `_Expired` with a bare `except:`; its result then still counts as a timeout). No
    limit with None, or off the main thread (see `call_sync`)."""
    fired = [False]
    if timeout_s is None or threading.current_thread() is not threading.main_thread():
        yield fired
        return
    done, finished, main = threading.Event(), [False], threading.main_thread().ident

    def interrupt():
        if not done.wait(timeout_s):
            while not done.is_set():
                signal.pthread_kill(main, _SIGNAL)
                done.wait(1.0)

    def expire(_signum, _frame):
        if not finished[0]:
            fired[0] = True
            raise _Expired

    previous = signal.signal(_SIGNAL, expire)
    watchdog = threading.Thread(target=interrupt, name="verl_hf-reward-deadline", daemon=True)
    watchdog.start()
    try:
        yield fired
    finally:
        finished[0] = True  # a plain store first: no signal handler can run before it, so none raises below
        done.set()
        watchdog.join()
        signal.signal(_SIGNAL, previous)


def call_sync(name: str, func: Callable, kwargs: dict, timeout_s: float | None):
    """`func(**kwargs)`, its exception, or RewardTimeout past `timeout_s` (an awaitable is returned as is).
    Functions marked `runs_collectives` (reward models sharded over processes) run without a limit: a timeout
    on one process alone would leave the others waiting in a collective."""
    if getattr(func, "runs_collectives", False):
        timeout_s = None
    if timeout_s is not None and threading.current_thread() is not threading.main_thread():
        return _in_worker_thread(name, func, kwargs, timeout_s)
    try:
        with deadline(timeout_s) as fired:
            out = func(**kwargs)
    except _Expired:
        return RewardTimeout(_expired(name, timeout_s))
    except Exception as exc:  # noqa: BLE001 - handled by the caller, with the function's name
        return RewardTimeout(_expired(name, timeout_s)) if fired[0] else exc
    return RewardTimeout(_expired(name, timeout_s) + " (it caught the interruption itself)") if fired[0] else out


def _in_worker_thread(name: str, func: Callable, kwargs: dict, timeout_s: float):
    """Off the main thread no signal reaches the call: it runs in a daemon thread, abandoned at the limit (a
    plain thread: an executor's workers would be joined at interpreter exit, and a hung one would never end)."""
    box: list = []

    def run():
        try:
            box.append(func(**kwargs))
        except Exception as exc:  # noqa: BLE001
            box.append(exc)

    worker = threading.Thread(target=run, name="verl_hf-reward", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return RewardTimeout(_expired(name, timeout_s) + " (its thread is left running)")
    return box[0]


def _expired(name: str, timeout_s: float | None, setting: str = "reward_timeout_s") -> str:
    return f"{name!r} did not return within {setting}={timeout_s}."


def call_all(reward_funcs: list[tuple[str, Callable]], batch: dict, timeout_s: float | None = None) -> list:
    """Each function's output (or the exception it raised, or RewardTimeout) on `batch` (keyword arguments):
    sync functions in turn, then every async one concurrently."""
    outputs, pending = [], {}
    for j, (name, func) in enumerate(reward_funcs):
        out = call_sync(name, func, batch, timeout_s)
        if inspect.isawaitable(out):
            pending[j] = out
        outputs.append(out)
    names = [reward_funcs[j][0] for j in pending]
    for j, result in zip(pending, run_coroutines(list(pending.values()), timeout_s, names)):
        outputs[j] = result
    return outputs


def per_sample(name: str, func: Callable, batch: dict, n: int, timeout_s: float | None = None,
               one_at_a_time: bool = False) -> list:
    """`func`'s output (or exception) for each sample alone: sync calls in turn, each within `timeout_s`, async
    ones concurrently (`one_at_a_time`: in turn too, for a function that blocked the event loop, so that the
    blocking sample is the one that fails). Once MAX_SAMPLE_TIMEOUTS samples have timed out the function is
    taken to be down and the rest fail unrun: a dead judge costs a few limits, not one per sample."""
    results, timeouts = [], 0
    for i in range(n):
        if timeouts >= MAX_SAMPLE_TIMEOUTS:
            results.append(RewardTimeout(_expired(name, timeout_s) + f" Not run: it had timed out on {timeouts} "
                                                                     f"samples already."))
            continue
        out = call_sync(name, func, {k: v[i : i + 1] for k, v in batch.items()}, timeout_s)
        if one_at_a_time and inspect.isawaitable(out):
            out = run_coroutines([out], timeout_s, [name])[0]
        results.append(out)
        timeouts += isinstance(out, RewardTimeout)
    awaiting = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
    for i, r in zip(awaiting, run_coroutines([results[i] for i in awaiting], timeout_s, [name] * len(awaiting))):
        results[i] = r
    return results


def recover(name: str, func: Callable, batch: dict, n: int, error: Exception, on_error: str,
            timeout_s: float | None = None) -> list:
    """After `func` raised `error` on the whole batch (or timed out): its one-sample outputs, with None where a
    sample fails (on_error='zero'); with on_error='raise', an error naming the first failing sample."""
    results = per_sample(name, func, batch, n, timeout_s, one_at_a_time=getattr(error, "blocked_loop", False))
    failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
    if on_error == "zero":
        return [None if isinstance(r, Exception) else r for r in results]
    if not failed and isinstance(error, RewardTimeout):  # slow on the whole batch, fine sample by sample
        logger.warning("reward function %r took longer than reward_timeout_s on the whole batch of %d; scored one "
                       "sample at a time instead (raise reward_timeout_s to avoid the second pass).", name, n)
        return results
    if not failed:
        raise RuntimeError(f"reward function {name!r} raised on the whole batch of {n}, though each sample alone "
                           f"passes: {type(error).__name__}: {error}") from error
    index, exc = failed[0], results[failed[0]]
    prompt = str(batch["prompts"][index])[:80]
    what, fix = (("timed out", "Make it faster or raise reward_timeout_s") if isinstance(exc, RewardTimeout)
                 else ("raised", "Fix the function"))
    raise RuntimeError(f"reward function {name!r} {what} on sample {index} of {n} ({len(failed)} fail; prompt "
                       f"{prompt!r}): {type(exc).__name__}: {str(exc).rstrip('.')}.{form_hint(batch['completions'], exc)}"
                       f" {fix}, or set reward_on_error='zero' to score failing samples 0 and count them "
                       f"(reward/{name}/errors).") from exc
