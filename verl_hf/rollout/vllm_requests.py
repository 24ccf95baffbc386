"""Colocated vLLM serving many callers at once, so that multi-turn samples advance independently.

`RequestDriver.serve_while(work)` runs `work` in a thread of its own while the calling thread drives the
engine: the `generate` calls `work` makes, from any thread, leave their requests in the driver's inbox and
wait; the driver adds them to vLLM as they arrive and steps the engine, so each step samples whatever is in
flight (continuous batching across turns and samples), and hands a call its outputs once all its requests
have finished. Every forward pass stays on the driving thread, the one vLLM's CPU threads were set up on.
Outside `serve_while`, a call samples directly (one batched `LLM.generate`). If the driving fails, every
waiting call and every later call of that `work` raises, and the requests in flight are aborted: nothing
waits for an engine that stopped.

See it work: tests/test_agent_vllm.py.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading


class RequestDriver:
    """Holds: the vLLM `LLM`, the inbox of calls not yet added to it, the current `work` (a future, done once
    it returns) and the thread driving for it, the error that stopped the driving if one did, and a counter
    for our request ids."""

    def __init__(self, llm):
        self.llm, self.inbox, self.lock = llm, queue.Queue(), threading.Lock()
        self.work, self.driver, self.failed = None, None, None
        self.added = itertools.count()  # our own request ids: vLLM's outputs come back under them

    def sample(self, prompts: list, params: list, lora_request) -> list:
        """vLLM's RequestOutputs of these requests (TokensPrompt, SamplingParams pairs), in order."""
        with self.lock:
            served = (self.work is not None and not self.work.done()
                      and threading.current_thread() is not self.driver)
            if served and self.failed is not None:
                raise RuntimeError(f"the vLLM engine stopped serving: {self.failed}") from self.failed
            if served:
                call = concurrent.futures.Future()
                self.inbox.put((prompts, params, lora_request, call))
        if not served:
            return self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
        return call.result()

    def serve_while(self, work):
        """`work()`'s result, `work` run in a thread of its own while this thread serves its calls."""
        done = concurrent.futures.Future()

        def run():
            try:
                done.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as raised
                done.set_exception(exc)

        with self.lock:
            self.work, self.driver, self.failed = done, threading.current_thread(), None
        threading.Thread(target=run, name="verl_hf-multi-turn", daemon=True).start()
        self._drive(done)
        return done.result()

    def _drive(self, done) -> None:
        flight: dict[str, tuple] = {}  # request id -> (its call, its place in the call)
        outputs: dict = {}  # call -> its requests' outputs (None until finished)
        try:
            while not done.done() or flight:
                self._admit(flight, outputs, wait=not flight)
                if done.done() and flight:  # nobody waits for these any more (the work ended with an error)
                    raise RuntimeError("the multi-turn rollout ended with requests in flight")
                if flight:
                    self._step(flight, outputs)
        except BaseException as exc:  # every waiting call, and every later one, is told: nothing hangs
            self._fail(exc, flight, outputs)
            if not done.done():
                raise

    def _step(self, flight: dict, outputs: dict) -> None:
        """One engine step; each call whose requests have all finished gets their outputs."""
        for out in self.llm.llm_engine.step():
            if not out.finished:
                continue
            call, place = flight.pop(out.request_id)
            outputs[call][place] = out
            if all(o is not None for o in outputs[call]):
                call.set_result(outputs.pop(call))

    def _admit(self, flight: dict, outputs: dict, wait: bool) -> None:
        """Add the calls waiting in the inbox to the engine (with `wait`, wait a little for one first)."""
        from vllm.sampling_params import RequestOutputKind

        for prompts, params, lora_request, call in self._arrived(wait):
            ids, added = [f"verl_hf-{next(self.added)}" for _ in prompts], []
            try:
                for request, prompt, fields in zip(ids, prompts, params):
                    fields.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate asks: the whole output once
                    self.llm.llm_engine.add_request(request, prompt, fields, lora_request=lora_request)
                    added.append(request)
            except Exception as exc:  # noqa: BLE001 - this call's own error (e.g. a prompt too long)
                if added:
                    self.llm.llm_engine.abort_request(added)
                call.set_exception(exc)
                continue
            outputs[call] = [None] * len(ids)
            flight.update({request: (call, place) for place, request in enumerate(ids)})

    def _arrived(self, wait: bool) -> list:
        arrived = []
        try:
            arrived.append(self.inbox.get(timeout=0.01) if wait else self.inbox.get_nowait())
            while True:
                arrived.append(self.inbox.get_nowait())
        except queue.Empty:
            return arrived

    def _fail(self, error: BaseException, flight: dict, outputs: dict) -> None:
        """Abort the requests in flight; every waiting call, and every later one of this work, raises."""
        with self.lock:
            self.failed = error
            waiting = [*outputs, *(item[-1] for item in self._arrived(wait=False))]
        if flight:
            try:
                self.llm.llm_engine.abort_request(list(flight))
            except Exception:  # noqa: BLE001 - the engine may be what failed; the calls are told below
                pass
        for call in waiting:
            if not call.done():
                call.set_exception(RuntimeError(f"the vLLM engine stopped serving: {type(error).__name__}: {error}"))
