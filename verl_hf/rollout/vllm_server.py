"""Rollouts from a separate `vllm serve` (other GPUs or nodes), server mode.

Generation goes through the server's token-in/token-out route `/inference/v1/generate` (`--enable-scale-out`,
which `verl-hf vllm-serve` sets): no detokenization and no per-token strings, which on a small model halves the
server's time per round (benchmarks/async.py). A server without that route gets the completions API with token
ids in and out, and a warning. One request per prompt, so per-prompt seeds hold, sent concurrently so the server
batches them. Weights go through vLLM's native
weight-transfer protocol (control over HTTP; tensors over NCCL to other GPUs, CUDA IPC on the trainer's own GPU
or, on CPU, our gloo transport: vllm_transfer.py). Only process 0 of the trainer pushes (`WeightSync(owner_rank=0)`); every process samples.

The server must run with `VLLM_SERVER_DEV_MODE=1` (the weight-transfer routes), `--weight-transfer-config`
and `--logprobs-mode processed_logprobs`: `verl-hf vllm-serve MODEL` starts it so, or prints the native
command with `--print-command`.

See it work: tests/test_rollout_vllm_server.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import torch

from ..distributed import process_rank
from .base import Rollout, RolloutEngine, SamplingConfig
from .vllm_compat import tied_copies_engine_has
from .vllm_engine import (NO_HF_WEIGHTS, hf_meta_model, hf_weight_names, request_seeds, rollout_from_tokens,
                          sampling_fields, vllm_bucket)
from .vllm_transfer import (GLOO_BACKEND, IPC_BACKEND, TrainerSender, device_uuid, transport_device_problem,
                            worker_init_info)
from .vllm_version import check_vllm_version
from .vllm_vision import check_expanded, check_image_architecture, image_request

START_HINT = "start one with `verl-hf vllm-serve MODEL --port PORT` (see README, Rollout engines)"
TOKENS_ROUTE = "/inference/v1/generate"  # vLLM's token-in/token-out generation (vllm serve --enable-scale-out)
NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}


class VLLMServerEngine(RolloutEngine):
    receives_weights = True
    shared_by_processes = True  # one server for all training processes: process 0 alone pushes weights
    serves_requests_concurrently = True  # each call is HTTP requests of its own; the server batches them

    def __init__(self, url: str, config, pad_token_id: int, eos_token_ids: list[int], *, max_model_len: int,
                 timeout_s: float = 600.0, lora_rank: int | None = None, processor=None):
        """`config`: the policy's HF config (the server must serve the same architecture); `max_model_len`: the
        longest prompt + response the trainer will ask for. `lora_rank`: serve a LoRA adapter of at most this rank
        with the server's LoRA kernels (`load_adapter`): the latest version only (a push never runs during a
        generation); None: the sync pushes merged weights. `processor`: a vision-language policy's processor: the
        engine then takes image prompts (`generate(..., pixels=)`), sent to the server's token route with their
        images (rollout/vllm_vision.py); the server must serve that processor with the model."""
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.pad_token_id, self.eos_token_ids = pad_token_id, list(eos_token_ids)
        # /version first: every vLLM serves it, and an unsupported one is named before its other routes are asked
        check_vllm_version(str(self._call("GET", "/version").get("version")),
                           where=f"runs the server at {self.url}")
        vllm_config = self._call("GET", "/server_info?config_format=json")["vllm_config"]
        model, parallel = vllm_config["model_config"], vllm_config["parallel_config"]
        _check_server(model, vllm_config.get("weight_transfer_config"), max_model_len, self.url)
        self.model_name = (model.get("served_model_name") or model["model"])
        if isinstance(self.model_name, list):
            self.model_name = self.model_name[0]
        self.dtype = getattr(torch, str(model["dtype"]).removeprefix("torch."))
        self.transport = vllm_config["weight_transfer_config"]["backend"]
        self.server_workers = parallel["world_size"] * parallel.get("data_parallel_size", 1)
        self._meta = hf_meta_model(config, vision=processor is not None)
        self._names, tied = hf_weight_names(self._meta)
        self._tied = self._tied_copies_it_has(tied)
        self._sender = None
        self.tokens_route = self._has_tokens_route()
        self.accepts_images, self._image_token_id = processor is not None, getattr(processor, "image_token_id", None)
        if self.accepts_images:
            check_image_architecture(type(self._meta).__name__)
            if not self.tokens_route:
                raise ValueError(f"image prompts need the vLLM server's {TOKENS_ROUTE} (the completions API takes no "
                                 f"images with token ids): start it with --enable-scale-out, as `verl-hf vllm-serve` "
                                 f"does.")
        self.serves_adapters, self.adapter_version = bool(lora_rank), 0
        if lora_rank:
            problem = (server_lora_problem(vllm_config.get("lora_config"), lora_rank, self.url)
                       or server_lora_routes_problem(self.url, timeout_s))
            if problem:
                raise ValueError(f"vllm_lora='adapter': {problem}; or set vllm_lora='merge'.")
            if process_rank() == 0:  # the process that feeds the shared engine
                self._free_earlier_runs_adapters()

    def _has_tokens_route(self) -> bool:
        """Whether the server serves TOKENS_ROUTE. An empty body tells without generating: 422 (the route
        validated it: 400 or 422), 403 (disabled: no --enable-scale-out), 404 (a vLLM without it)."""
        try:
            self._call("POST", TOKENS_ROUTE, {})
        except RuntimeError as e:
            if " with 400:" in str(e) or " with 422:" in str(e):
                return True
        warnings.warn(f"The vLLM server at {self.url} does not serve {TOKENS_ROUTE} (start it with "
                      f"--enable-scale-out, as `verl-hf vllm-serve` does): rollouts go through /v1/completions, whose "
                      f"detokenization costs the server time on every token.")
        return False

    def _tied_copies_it_has(self, tied: dict[str, str]) -> dict[str, str]:
        """The tied copies to push (vLLM's Gemma-2 has no lm_head). A server without our vLLM plugin cannot
        list its parameters: then every copy is sent, and vLLM names any it lacks at the first sync."""
        if not tied:
            return tied
        try:
            names = self._call("POST", "/collective_rpc", {"method": "verl_hf_parameter_names"})["results"][0]
        except RuntimeError as e:
            warnings.warn(f"The vLLM server at {self.url} did not list its parameters ({str(e)[:200]}): is verl_hf "
                          f"installed where it runs (its vLLM plugin adds that route)? Every tied copy is sent.")
            return tied
        return tied_copies_engine_has(tied, set(names))

    # ---------------------------------------------------------------- HTTP
    def _call(self, method: str, route: str, body: dict | None = None):
        return server_call(self.url, method, route, body, self.timeout_s)

    # ---------------------------------------------------------------- weights
    def weight_names(self) -> list[str]:
        return self._names

    def prepare_for_weights(self) -> None:
        if self._sender is None:
            self._sender = self._connect()
        self._call("POST", "/start_weight_update")

    def _connect(self) -> TrainerSender:
        """Open the transfer group (this process is rank 0, the server's workers 1..): both sides block until
        all have joined, so the server's half runs in a thread. First: can the transport join these devices?"""
        self._check_devices()
        address = _address_towards(self.url)
        port = _free_port(address)
        world = self.server_workers + 1
        payload = {"init_info": worker_init_info(self.transport, address, port, world)}
        with ThreadPoolExecutor(1) as pool:
            server_side = pool.submit(self._call, "POST", "/init_weight_transfer_engine", payload)
            sender = TrainerSender(self.transport, address, port, world)
            server_side.result()
        return sender

    def _check_devices(self) -> None:
        """NCCL cannot join two processes on one GPU, CUDA IPC cannot reach another GPU, and IPC handles come
        pickled: say so before either fails inside vLLM. A server without our vLLM plugin cannot tell: a
        warning, and vLLM's own errors later."""
        if self.transport == GLOO_BACKEND:
            return
        try:
            facts = self._call("POST", "/collective_rpc", {"method": "verl_hf_transfer_facts"})["results"]
        except RuntimeError as e:
            warnings.warn(f"The vLLM server at {self.url} did not say which GPUs its workers use ({str(e)[:160]}): is "
                          f"verl_hf installed where it runs? The {self.transport} transport is tried unchecked.")
            return
        problem = transport_device_problem(self.transport, device_uuid(), [f["gpu"] for f in facts], self.url)
        if not problem and self.transport == IPC_BACKEND and not all(f["takes_handles"] for f in facts):
            problem = (f"the vLLM server at {self.url} takes weights by CUDA IPC but was started without "
                       f"VLLM_ALLOW_INSECURE_SERIALIZATION=1, so its workers refuse the handles: restart it with it "
                       f"(`verl-hf vllm-serve MODEL --transfer {IPC_BACKEND}` sets it)")
        if problem:
            raise RuntimeError(problem + ".")

    def load_weights(self, named_tensors) -> None:
        """One bucket (whole layers): the server learns names, dtypes and shapes, then receives the tensors. A
        failed update leaves the transfer group unusable: the next push opens a new one (or fails to, saying why)."""
        named_tensors = vllm_bucket(self._meta, named_tensors, self._tied)
        try:
            self._sender.send(named_tensors,
                              lambda info: self._call("POST", "/update_weights", {"update_info": info}))
        except BaseException:
            self._sender = None
            raise

    def finish_sync(self) -> None:
        self._call("POST", "/finish_weight_update")  # the weights keep their label until label_weights
        if self._sender is not None:
            self._sender.finish()
        self._call("POST", "/reset_prefix_cache")  # cached KV blocks were computed with the old weights
        if self.accepts_images:  # and cached image embeddings with the old vision tower
            self._call("POST", "/reset_encoder_cache")

    def label_weights(self, version: int) -> None:
        self._call("POST", "/update_weight_version", {"new_version": str(version)})

    @property
    def pauses_for_weights(self) -> bool:
        return self.tokens_route  # the completions API returns no weight spans to continue a choice with

    @contextlib.contextmanager
    def paused_for_weights(self):
        """vLLM's pause with mode=abort: the unfinished choices come back with the tokens they have and
        `generate` sends each again as prompt + tokens, which the server queues until /resume (vLLM 0.32) or
        refuses with 503 until then (0.33+: `_sample` sends it again once it resumes). The new weights
        then compute the whole prefix again: mode=keep would keep KV computed by the old weights, and the tokens
        after the switch would follow neither policy (PipelineRL accepts that; we match the trainer's forward)."""
        if not self.tokens_route:
            raise RuntimeError(f"The vLLM server at {self.url} has no {TOKENS_ROUTE} (start it with "
                               f"--enable-scale-out, as `verl-hf vllm-serve` does): partial rollouts need it.")
        self._call("POST", "/pause?mode=abort")
        try:
            yield
        finally:
            self._call("POST", "/resume")

    def get_weights(self, names):
        raise NotImplementedError(NO_HF_WEIGHTS)

    def load_adapter(self, tensors, config) -> int:
        """The adapter to every worker (HTTP, vllm_lora.py), loaded by vLLM's /v1/load_lora_adapter under the next
        version's name; the previous version is freed."""
        from .vllm_lora import IN_MEMORY, adapter_name, encode_adapter

        if not self.serves_adapters:
            return super().load_adapter(tensors, config)
        version, previous = self.adapter_version + 1, self.adapter_version
        name = adapter_name(version)
        self._call("POST", "/collective_rpc", {"method": "verl_hf_wait_adapter",
                                                 "args": [name, encode_adapter(tensors), json.dumps(config)]})
        try:
            self._lora_call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": IN_MEMORY})
        except Exception:
            self._free_in_workers(name)  # not left waiting
            raise
        self.adapter_version = version
        if previous:
            self._free_adapter(adapter_name(previous))
        return version

    def _free_adapter(self, name: str) -> None:
        self._lora_call("/v1/unload_lora_adapter", {"lora_name": name})
        self._free_in_workers(name)

    def _free_in_workers(self, name: str) -> None:
        """The adapter `name` out of every worker, loaded or still waiting (vllm_lora.py)."""
        self._call("POST", "/collective_rpc", {"method": "verl_hf_free_adapter", "args": [name]})

    def _free_earlier_runs_adapters(self) -> None:
        """Versions an earlier run left on this server: vLLM would answer a name it knows with the old adapter."""
        from .vllm_lora import adapter_name

        for card in self._call("GET", "/v1/models")["data"]:
            if card["id"].startswith(adapter_name(0)[:-1]):
                self._free_adapter(card["id"])

    def _lora_call(self, route: str, body: dict) -> None:
        """vLLM's LoRA routes (plain-text answers); a server without them (no VLLM_ALLOW_RUNTIME_LORA_UPDATING)
        answers 404 Not Found, an unknown adapter a 404 naming it."""
        try:
            server_call(self.url, "POST", route, body, self.timeout_s, text=True)
        except RuntimeError as e:
            if _no_such_route(e):
                raise RuntimeError(f"The vLLM server at {self.url} has no {route} route: {RUNTIME_LORA}.") from e
            raise

    def loaded_adapters(self) -> list[int]:
        """The adapter ids the server's first worker holds now (one between syncs)."""
        return self._call("POST", "/collective_rpc", {"method": "verl_hf_loaded_adapters"})["results"][0]

    def _model_for_requests(self) -> str:
        """The adapter's name once one is loaded (the silent base-model fallback is an error); else the model's."""
        if not self.serves_adapters:
            return self.model_name
        from .vllm_lora import adapter_name, latest_version

        return adapter_name(latest_version(self))

    # ---------------------------------------------------------------- sampling
    def generate(self, prompt_ids: list[list[int]], params: SamplingConfig, pixels: list | None = None) -> Rollout:
        """`pixels` (an engine built with a processor): one `vision.RowPixels` or None per prompt."""
        if not prompt_ids:
            raise ValueError("VLLMServerEngine.generate got no prompts.")
        if pixels and not self.accepts_images:
            raise ValueError("this vLLM server engine was built without the policy's processor and takes no images; "
                             "build it with VLLMServerEngine(..., processor=processor).")
        version = self.adapter_version  # what the requests name (a push never runs during a generation)
        requests = self._requests(prompt_ids, params)
        expanded = [None] * len(requests)  # the trainer's ids of each image prompt, which the server must expand to
        for row, (request, row_pixels) in enumerate(zip(requests, pixels or [])):
            if row_pixels is not None:
                request.update(image_request(prompt_ids[row], row_pixels.images, self._image_token_id))
                expanded[row] = prompt_ids[row]
        with ThreadPoolExecutor(min(64, len(requests))) as pool:
            choices = [c for answer in pool.map(self._choices, requests, expanded) for c in answer]
        logprobs = [_chosen_logprobs(c, self.tokens_route) for c in choices] if params.return_logprobs else None
        rollout = rollout_from_tokens(prompt_ids, [c["token_ids"] for c in choices], logprobs,
                                      params.num_return_sequences, self.pad_token_id, self.eos_token_ids)
        if self.tokens_route:
            rollout.versions = _token_versions(choices, rollout.response_mask)
        rollout.adapter_version = version or None
        return rollout

    def _requests(self, prompt_ids: list[list[int]], params: SamplingConfig) -> list[dict]:
        """One request body per prompt, for the route the server has."""
        fields = {k: v for k, v in sampling_fields(params, self.eos_token_ids).items() if v is not None}
        # Neutral values sent explicitly: the server would otherwise fill them from the model's
        # generation_config.json (e.g. a repetition_penalty), sampling off-policy.
        fields.update(NEUTRAL_SAMPLING)
        seeds = request_seeds(params, len(prompt_ids))
        model = self._model_for_requests()
        if self.tokens_route:
            sampling = dict(fields, detokenize=False)
            return [{"model": model, "token_ids": list(p), "sampling_params": dict(sampling, seed=s)}
                    for p, s in zip(prompt_ids, seeds)]
        base = dict(fields, model=model, return_token_ids=True, skip_special_tokens=False)
        return [dict(base, prompt=list(p), seed=s) for p, s in zip(prompt_ids, seeds)]

    def _choices(self, request: dict, expanded: list[int] | None = None) -> list[dict]:
        """One request's choices in index order, each finished: a choice that a pause for weights aborted
        (paused_for_weights) is sent again as its prompt + the tokens it has, for the tokens still to come.
        `expanded`: an image prompt's ids as the trainer expanded them, which the server's must equal."""
        if not self.tokens_route:  # never paused (paused_for_weights refuses): nothing to continue
            return sorted(self._sample("/v1/completions", request)["choices"], key=lambda c: c["index"])
        answer = self._sample(TOKENS_ROUTE, request)
        if expanded is not None:
            if answer.get("prompt_token_ids") is None:
                raise RuntimeError(f"the vLLM server at {self.url} returned no prompt_token_ids for an image prompt "
                                   f"(return_token_ids): its image processing cannot be checked against the "
                                   f"trainer's; serve with a vLLM whose {TOKENS_ROUTE} returns them (0.32 does).")
            check_expanded(expanded, answer["prompt_token_ids"], row=None)
        answered = {c["index"]: c for c in answer["choices"]}
        choices = []
        for index in range(request["sampling_params"]["n"]):
            # a choice aborted before it was scheduled may be missing: it starts again from its prompt
            choice = answered.get(index) or {"index": index, "finish_reason": "abort", "token_ids": []}
            idle = 0  # continuations in a row that brought no token: a server that keeps aborting is an error
            while choice["finish_reason"] == "abort":
                rest = _continuation(request, choice)
                if rest is None:  # aborted with every allowed token: it ended by length
                    choice = dict(choice, finish_reason="length")
                    break
                before = len(choice["token_ids"])
                choice = _joined(choice, self._sample(TOKENS_ROUTE, rest)["choices"][0])
                idle = 0 if len(choice["token_ids"]) > before else idle + 1
                if idle == MAX_IDLE_ABORTS:
                    raise RuntimeError(f"the vLLM server at {self.url} aborted a response {idle} times in a row "
                                       f"without a new token (is it shutting down, or paused by another client?)")
            choices.append(choice)
        return choices

    def _sample(self, route: str, body: dict) -> dict:
        """POST one sampling request. A request the server refuses while it is paused for weights (vLLM 0.33+
        answers 503 from /pause until /resume; 0.32 queued it instead) waits and is sent again, with backoff, for
        at most vllm_server_timeout_s: a pause lasts one weight push, and the producer must outlive it. A server
        that never resumes ends the run, naming it."""
        deadline, delay = time.monotonic() + self.timeout_s, PAUSED_RETRY_FIRST_S
        while True:
            try:
                return self._call("POST", route, body)
            except ServerRefused as refused:
                if time.monotonic() + delay > deadline:
                    raise RuntimeError(f"The vLLM server at {self.url} refused sampling requests for "
                                       f"vllm_server_timeout_s={self.timeout_s} as paused and did not resume: another "
                                       f"client paused it, or a run was killed between /pause and /resume (POST "
                                       f"{self.url}/resume, or restart it). Its last answer: {refused}") from refused
                time.sleep(delay)
                delay = min(2 * delay, PAUSED_RETRY_MAX_S)


PAUSED_RETRY_FIRST_S, PAUSED_RETRY_MAX_S = 0.02, 0.25  # a pause for weights lasts one push: seconds at most


class ServerRefused(RuntimeError):
    """The server refused a request while paused (HTTP 503, "Generation is paused"): vLLM 0.33+ does so for new
    requests from /pause until /resume."""


def server_call(url: str, method: str, route: str, body: dict | None, timeout_s: float,
                fields: tuple[str, str] = ("vllm_server_url", "vllm_server_timeout_s"), text: bool = False):
    """The JSON answer of the server at `url` to `method route` with `body` (`text`: the answer as text); every
    failure names the server, what it said, and the setting to change (`fields`: the URL's and the timeout's)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + route, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = response.read() or b"null"
        return answer.decode(errors="replace") if text else json.loads(answer)
    except urllib.error.HTTPError as e:
        said = e.read().decode(errors="replace")[:800]
        if e.code == 404 and route.split("?")[0] in ("/server_info", "/start_weight_update"):
            raise RuntimeError(f"The vLLM server at {url} has no {route.split('?')[0]} route: it was started without "
                               f"VLLM_SERVER_DEV_MODE=1, which enables the weight-transfer routes; {START_HINT}.") from e
        # vLLM 0.33+ refuses during a pause with "Generation is paused. Please retry after it resumes."; other 503s
        # (a full queue, a faulted engine) are not waited out
        error = ServerRefused if e.code == 503 and "generation is paused" in said.lower() else RuntimeError
        raise error(f"The vLLM server at {url} answered {method} {route} with {e.code}: {said}") from e
    except TimeoutError as e:
        raise TimeoutError(f"The vLLM server at {url} did not answer {method} {route} within {fields[1]}={timeout_s}; "
                           f"raise it or check the server's log.") from e
    except (urllib.error.URLError, ConnectionError) as e:
        raise ConnectionError(f"No vLLM server answers at {fields[0]}={url} ({e}); {START_HINT}, and wait until GET "
                              f"{url}/health answers.") from e


MAX_IDLE_ABORTS = 50  # pauses for weights abort a response once each; this many without progress is not that


def _continuation(request: dict, so_far: dict) -> dict | None:
    """The request for the rest of an aborted choice: the prompt + its tokens, one sample, the tokens still
    allowed, and a seed of its own (the request's, with the choice and its length mixed in: the same pause point
    gives the same tokens). None when no token is left to sample."""
    tokens = list(so_far.get("token_ids") or [])
    sampling = request["sampling_params"]
    left = sampling["max_tokens"] - len(tokens)
    if left <= 0:
        return None
    seed = sampling.get("seed")
    if seed is not None:
        seed = (seed * 1_000_003 + so_far["index"] * 65_537 + len(tokens)) % 2**31
    return dict(request, token_ids=request["token_ids"] + tokens,
                sampling_params=dict(sampling, n=1, max_tokens=left, seed=seed))


def _joined(first: dict, rest: dict) -> dict:
    """One choice of an aborted choice and its continuation: tokens, log-probs and weight spans in order."""
    done = len(first.get("token_ids") or [])
    spans = [*(first.get("weight_versions") or []),
             *(dict(s, start=s["start"] + done, end=s["end"] + done) for s in rest.get("weight_versions") or [])]
    logprobs = rest.get("logprobs")
    if logprobs is not None and done:
        logprobs = dict(logprobs, content=first["logprobs"]["content"] + logprobs["content"])
    return dict(rest, index=first["index"], token_ids=list(first.get("token_ids") or []) + rest["token_ids"],
                logprobs=logprobs, weight_versions=spans)


def _token_versions(choices: list[dict], response_mask: torch.Tensor) -> torch.Tensor | None:
    """(B, Lr) each token's weight label from the choices' spans (0 on padding); None unless every token is
    covered by an integer label (label_weights: a server never labelled says "default")."""
    versions = torch.zeros(response_mask.shape, dtype=torch.long)
    for row, choice in enumerate(choices):
        covered = 0
        for span in choice.get("weight_versions") or []:
            if not str(span["version"]).lstrip("-").isdigit():
                return None
            versions[row, span["start"]:span["end"]] = int(span["version"])
            covered = max(covered, span["end"])
        if covered < len(choice["token_ids"]):
            return None
    return versions * response_mask


def _chosen_logprobs(choice: dict, tokens_route: bool) -> list[float]:
    """The sampled tokens' log-probs from one choice of either route's answer."""
    if tokens_route:
        return [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return choice["logprobs"]["token_logprobs"]


def _check_server(model: dict, transfer: dict | None, max_model_len: int, url: str) -> None:
    """Refuse a server that would sample wrongly or could not receive weights, before any training."""
    if transfer is None:
        raise ValueError(f"The vLLM server at {url} has no --weight-transfer-config, so it cannot receive the "
                         f"trained weights; {START_HINT}.")
    if model.get("logprobs_mode") != "processed_logprobs":
        raise ValueError(f"The vLLM server at {url} returns logprobs_mode={model.get('logprobs_mode')!r}; the trainer "
                         f"needs sampling log-probs after temperature: restart it with --logprobs-mode "
                         f"processed_logprobs (`verl-hf vllm-serve` sets it).")
    if model.get("generation_config", "vllm") != "vllm":
        raise ValueError(f"The vLLM server at {url} takes sampling defaults from the model's generation_config "
                         f"(--generation-config {model.get('generation_config')!r}); restart it with "
                         f"--generation-config vllm (`verl-hf vllm-serve` sets it) so that it samples exactly as "
                         f"the trainer asks.")
    if model["max_model_len"] < max_model_len:
        raise ValueError(f"The vLLM server at {url} has max_model_len={model['max_model_len']} but prompts + "
                         f"responses need {max_model_len} (max_prompt_length + max_response_length): restart it with "
                         f"--max-model-len {max_model_len} or shorten them.")


ADAPTER_SLOTS = 2  # the version requests use, and the next, loaded before the old one is freed


def server_lora_problem(lora: dict | None, rank: int, url: str) -> str:
    """Why the server cannot serve an adapter of this rank ("" when it can): LoRA on, the rank fits, two slots."""
    start = f"`verl-hf vllm-serve MODEL --lora-rank {rank}` starts it so"
    if not lora:
        return f"the vLLM server at {url} was started without LoRA ({start})"
    if lora.get("max_lora_rank", 0) < rank or lora.get("max_loras", 0) < ADAPTER_SLOTS:
        return (f"the vLLM server at {url} has max_lora_rank={lora.get('max_lora_rank')} and max_loras="
                f"{lora.get('max_loras')}, and the adapter needs rank {rank} and {ADAPTER_SLOTS} slots ({start})")
    return ""


RUNTIME_LORA = ("start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, which enables vLLM's runtime LoRA routes "
                "(`verl-hf vllm-serve MODEL --lora-rank R` sets it)")


def _no_such_route(error: RuntimeError) -> bool:
    """A `server_call` error for a route the server does not serve (404 Not Found; an unknown adapter is a 404
    that names it instead)."""
    return " with 404: " in str(error) and "Not Found" in str(error)


def server_lora_routes_problem(url: str, timeout_s: float) -> str:
    """Why the server, started with LoRA, cannot take adapters at run time ("" when it can): vLLM's
    /v1/load_lora_adapter (an empty body is refused by its validation where the route exists; 404 Not Found
    where VLLM_ALLOW_RUNTIME_LORA_UPDATING was not set) and our plugin's worker method."""
    try:
        server_call(url, "POST", "/v1/load_lora_adapter", {}, timeout_s, text=True)
    except RuntimeError as e:
        if _no_such_route(e):
            return f"the vLLM server at {url} has no /v1/load_lora_adapter: {RUNTIME_LORA}"
    try:
        server_call(url, "POST", "/collective_rpc", {"method": "verl_hf_loaded_adapters"}, timeout_s)
    except RuntimeError as e:
        return (f"the vLLM server at {url} did not run verl_hf's adapter method ({str(e)[:160]}): install verl_hf "
                f"where the server runs (its vLLM plugin adds it)")
    return ""


def _address_towards(url: str) -> str:
    """This machine's address on the route to the server (what the server's workers connect back to)."""
    parsed = urlparse(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((socket.gethostbyname(parsed.hostname), parsed.port or 80))  # UDP: nothing is sent
        return probe.getsockname()[0]


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
