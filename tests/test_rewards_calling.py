"""Reward functions that are async, ones that raise, and ones that never return (time limits)."""

import asyncio

import pytest

from verl_hf.rewards import score_completions


def _score(funcs, n=4, **kwargs):
    return score_completions(funcs, None, prompts=[f"p{i}" for i in range(n)],
                             completions=[f"c{i}" for i in range(n)], completion_ids=[[i] for i in range(n)],
                             columns={"answer": list(range(n))}, **kwargs)


def test_async_functions_run_concurrently_beside_sync_ones():
    """Four async functions that each sleep 0.4 s finish together: under half the 1.6 s they would take one after
    another (a bound 2x away from the serial path, 0.4 s above the concurrent one)."""
    import time

    def sleeper(name, value):
        async def slow(prompts, completions, completion_ids, answer):
            await asyncio.sleep(0.4)
            return [value] * len(answer)

        return (name, slow)

    def plain(prompts, completions, completion_ids, answer):
        return [0.5] * len(answer)

    start = time.perf_counter()
    result = _score([sleeper("a", 1.0), sleeper("b", 1.0), sleeper("c", 0.0), sleeper("d", 0.0), ("plain", plain)])
    assert time.perf_counter() - start < 0.8
    assert result.rewards.tolist() == [2.5] * 4


def test_async_function_inside_a_running_event_loop():
    """As in a notebook: score_completions called from code that already runs an event loop."""
    async def reward(prompts, completions, completion_ids, answer):
        return [2.0] * len(answer)

    async def caller():
        return _score([("r", reward)])

    assert asyncio.run(caller()).rewards.tolist() == [2.0] * 4


def _fails_on_two(prompts, completions, completion_ids, answer):
    if 2 in answer:
        raise ZeroDivisionError("bad sample")
    return [1.0] * len(answer)


def test_an_async_client_made_once_works_in_every_batch():
    """An asyncio object created in the first batch (as an HTTP client would be) is still usable later: every
    batch runs on the same event loop."""
    state = {}

    async def judge(prompts, completions, completion_ids, answer):
        loop = asyncio.get_running_loop()
        state.setdefault("loop", loop)
        state.setdefault("lock", asyncio.Lock())
        async with state["lock"]:  # bound to the first loop: raises if called from another
            return [1.0 if loop is state["loop"] else 0.0] * len(answer)

    assert _score([("judge", judge)]).rewards.tolist() == [1.0] * 4
    assert _score([("judge", judge)]).rewards.tolist() == [1.0] * 4


def test_raising_function_names_itself_and_the_sample():
    with pytest.raises(RuntimeError, match=r"reward function 'judge' raised on sample 2 of 4 \(1 fail; prompt 'p2'\): "
                                           r"ZeroDivisionError: bad sample.*reward_on_error='zero'"):
        _score([("judge", _fails_on_two)])


def test_on_error_zero_scores_failures_zero_and_counts_them():
    async def async_fails(prompts, completions, completion_ids, answer):
        return _fails_on_two(prompts, completions, completion_ids, answer)

    for func in (_fails_on_two, async_fails):
        result = _score([("judge", func)], on_error="zero")
        assert result.rewards.tolist() == [1.0, 1.0, 0.0, 1.0]
        assert result.metrics()["reward/judge/errors"] == 1.0
    clean = _score([("judge", lambda **kw: [1.0] * 4)], on_error="zero")
    assert clean.metrics()["reward/judge/errors"] == 0.0


def test_failure_of_the_batch_call_only_is_raised_with_a_note():
    def batch_only(prompts, completions, completion_ids, answer):
        if len(answer) > 1:
            raise MemoryError("batch too big")
        return [1.0]

    with pytest.raises(RuntimeError, match="'big' raised on the whole batch of 4, though each sample alone passes"):
        _score([("big", batch_only)])
    assert _score([("big", batch_only)], on_error="zero").rewards.tolist() == [1.0] * 4


def test_bad_on_error_value():
    with pytest.raises(ValueError, match="reward_on_error='skip' must be one of"):
        _score([("r", lambda **kw: [1.0] * 4)], on_error="skip")


# ---------------------------------------------------------------- time limits (reward_timeout_s)
def _hangs_on_two(prompts, completions, completion_ids, answer):
    import time

    if 2 in answer:
        time.sleep(3600)  # a request that never returns
    return [1.0] * len(answer)


async def _async_hangs_on_two(prompts, completions, completion_ids, answer):
    if 2 in answer:
        await asyncio.sleep(3600)
    return [1.0] * len(answer)


async def _blocks_the_loop_on_two(prompts, completions, completion_ids, answer):
    import time

    if 2 in answer:
        time.sleep(3)  # blocking code inside `async def`: the loop itself stops
    return [1.0] * len(answer)


def _spins_and_swallows(prompts, completions, completion_ids, answer):
    while True:  # a busy loop whose own `except Exception` would swallow an ordinary exception
        try:
            sum(range(1000))
        except Exception:  # noqa: BLE001
            pass


@pytest.mark.parametrize("func", [_hangs_on_two, _async_hangs_on_two, _blocks_the_loop_on_two],
                         ids=["sync", "async", "async-blocking"])
def test_a_function_that_never_returns_is_stopped_and_names_the_sample(func):
    import time

    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"'judge' timed out on sample 2 of 4 \(1 fail; prompt 'p2'\): "
                                           r"RewardTimeout: 'judge' did not return within reward_timeout_s=0.5") as caught:
        _score([("judge", func)], timeout_s=0.5)
    if func is _blocks_the_loop_on_two:  # the loop was replaced: clients bound to the old one need remaking
        assert "must be created again" in str(caught.value)
    assert time.monotonic() - start < 5  # the batch call, then the samples within one more limit (+ grace)
    start = time.monotonic()
    result = _score([("judge", func)], timeout_s=0.5, on_error="zero")
    assert result.rewards.tolist() == [1.0, 1.0, 0.0, 1.0] and result.metrics()["reward/judge/errors"] == 1.0
    assert time.monotonic() - start < 5


def test_a_busy_loop_that_swallows_exceptions_is_stopped():
    with pytest.raises(RuntimeError, match="timed out on sample 0 of 4"):
        _score([("spin", _spins_and_swallows)], timeout_s=0.3)


def test_no_limit_and_a_fast_function_leave_nothing_behind():
    import signal
    import threading

    before = signal.getsignal(signal.SIGUSR2), threading.active_count()
    assert _score([("ok", lambda **kw: [1.0] * 4)], timeout_s=5.0).rewards.tolist() == [1.0] * 4
    assert (signal.getsignal(signal.SIGUSR2), threading.active_count()) == before
    assert _score([("ok", lambda **kw: [1.0] * 4)], timeout_s=None).rewards.tolist() == [1.0] * 4


def test_off_the_main_thread_the_call_is_abandoned_at_the_limit():
    import threading

    caught = []

    def train():
        try:
            _score([("judge", _hangs_on_two)], timeout_s=0.3)
        except RuntimeError as error:
            caught.append(str(error))

    worker = threading.Thread(target=train)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and caught and "its thread is left running" in caught[0]


def test_slow_on_the_batch_but_fine_per_sample_is_scored_not_fatal():
    import time

    def slow_batch(prompts, completions, completion_ids, answer):
        time.sleep(0.2 * len(answer))  # 0.8 s for the batch, 0.2 s a sample: under a 0.5 s limit alone
        return [1.0] * len(answer)

    assert _score([("slow", slow_batch)], timeout_s=0.5).rewards.tolist() == [1.0] * 4


def test_a_function_that_swallows_the_interruption_still_times_out():
    import time

    def stubborn(prompts, completions, completion_ids, answer):
        try:
            time.sleep(3600)
        except BaseException:  # noqa: BLE001 - a bare except, as some verifiers have
            return [0.5] * len(answer)

    result = _score([("stubborn", stubborn)], timeout_s=0.3, on_error="zero")
    assert result.rewards.tolist() == [0.0] * 4 and result.metrics()["reward/stubborn/errors"] == 4.0


def test_an_async_functions_own_timeout_is_its_error_not_ours():
    async def own_timeout(prompts, completions, completion_ids, answer):
        raise TimeoutError("the judge's HTTP client gave up")

    with pytest.raises(RuntimeError, match=r"'judge' raised on sample 0 of 4.*TimeoutError: the judge's HTTP client"):
        _score([("judge", own_timeout)], timeout_s=5.0)

    async def cancelled(prompts, completions, completion_ids, answer):
        raise asyncio.CancelledError

    with pytest.raises(RuntimeError, match=r"'judge' raised on sample 0 of 4.*'judge' was cancelled"):
        _score([("judge", cancelled)], timeout_s=5.0)
