"""Rollout routing replay (R3) for mixture-of-experts policies: the training forward sends every token
through the experts that the rollout engine chose for it.

Why: the engine and the trainer compute the router's top-k independently; small numerical differences
(another kernel, bf16 sampling weights against fp32 training ones) flip near-tied choices, the flips compound
over layers, and the trainer then scores tokens with experts that never produced them (Ma et al. 2025,
"Stabilizing MoE RL by aligning training and inference routers"; verl's `router_replay.mode=R3`, NeMo-RL's
`router_replay`). Only the discrete choice is replayed: the weights of the chosen experts are recomputed from
the live router logits, so the router keeps its gradient.

Routes are int16 tensors (rows, positions, layers, top_k) of expert ids, -1 where a position has no recorded
route (padding, the last sampled token, which no forward consumed): those positions route live.

- `moe_routers(model)`: the model's routers, by decoder layer; a clear error where replay cannot work.
- `recorded_routes(model)`: a context that records each router's choices over the forwards it runs
  (HF generate: the prefill, then one call per decoding step).
- `RoutingReplay(model)`: hooks that, inside `replaying(prompt_routes, response_routes)`, replace each router's
  choice by the recorded one; `take_metrics()` reports how often the live router would have agreed. One per
  policy: the Actor owns it.

The reference policy is not replayed: it is another policy, scored on its own routing.

See it work: tests/test_routing_replay.py.
"""

from __future__ import annotations

import contextlib
import re

import torch

# Routers that choose top-k of softmax(logits) and weight the chosen experts by those probabilities,
# renormalised when the router's `norm_topk_prob` is set (Mixtral's and Qwen3-VL-MoE's, which have none, always
# renormalise). `GptOssTopKRouter` takes the top-k logits and softmaxes over them.
SOFTMAX_ROUTERS = ("MixtralTopKRouter", "Qwen2MoeTopKRouter", "Qwen3MoeTopKRouter", "OlmoeTopKRouter",
                   "Qwen3VLMoeTextTopKRouter")
CHOSEN_SOFTMAX_ROUTERS = ("GptOssTopKRouter",)
NO_ROUTE = -1
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def moe_routers(model) -> dict[int, list[torch.nn.Module]]:
    """{decoder layer index: its router modules} of `model` (through DDP/DeepSpeed/PEFT wrappers). A layer has
    two when PEFT's `modules_to_save` holds the router: the trained copy and the original (the adapter-disabled
    reference's); one of them runs in each forward."""
    routers, unknown = {}, set()
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not kind.endswith("Router"):
            continue
        if kind not in SOFTMAX_ROUTERS + CHOSEN_SOFTMAX_ROUTERS:
            unknown.add(kind)
            continue
        layer = _LAYER.search(name)
        if layer is not None:
            routers.setdefault(int(layer.group(1)), []).append(module)
    architecture = type(_unwrapped(model)).__name__
    if unknown:
        raise ValueError(f"routing_replay does not know how {sorted(unknown)} of {architecture} weight the experts "
                         f"they choose; it supports {SOFTMAX_ROUTERS + CHOSEN_SOFTMAX_ROUTERS}. Set "
                         f"routing_replay=False for this model.")
    if not routers:
        raise ValueError(f"routing_replay replays the expert choices of a mixture-of-experts model, and {architecture} "
                         f"has no MoE router; set routing_replay=False.")
    return routers


def route_shape(routers: dict[int, list[torch.nn.Module]]) -> tuple[int, int]:
    """(layer slots, top_k) of the routes of these routers: one slot per decoder layer up to the last MoE one."""
    return max(routers) + 1, next(iter(routers.values()))[0].top_k


def replayed_scores(router, logits: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weights (N, k) of the experts `indices` (N, k) from the live router logits (N, E), as `router` weighs
    its own choice. Softmax routers: p = softmax(logits); w = p[indices], / sum(w) when the router renormalises
    (Mixtral always). gpt-oss: w = softmax(logits[indices])."""
    if type(router).__name__ in CHOSEN_SOFTMAX_ROUTERS:
        return torch.softmax(logits.gather(-1, indices), dim=1, dtype=logits.dtype).to(dtype)
    chosen = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, indices)
    if getattr(router, "norm_topk_prob", True):
        chosen = chosen / chosen.sum(dim=-1, keepdim=True)
    return chosen.to(dtype)


@contextlib.contextmanager
def recorded_routes(model):
    """Records every router's chosen experts over the forwards run inside; yields a list that, on exit, holds
    one int16 tensor (tokens of that forward, layer slots, top_k) per forward call, NO_ROUTE in layers without
    a router. The choices stay on the model's device (int16) until one copy at the end."""
    routers = moe_routers(model)
    slots, top_k = route_shape(routers)
    calls: dict[int, list[torch.Tensor]] = {layer: [] for layer in routers}
    hooks = [module.register_forward_hook(lambda _m, _a, out, layer=layer: calls[layer].append(out[2].to(torch.int16)))
             for layer, modules in routers.items() for module in modules]
    forwards: list[torch.Tensor] = []
    try:
        yield forwards
    finally:
        for hook in hooks:
            hook.remove()
    counts = {len(choices) for choices in calls.values()}
    if counts == {0} or len(counts) != 1:
        raise RuntimeError(f"routing replay recorded {sorted(counts)} router calls per MoE layer while the model "
                           f"generated: its MoE blocks do not call their router modules once per forward (e.g. a "
                           f"fused kernel from the Hub); set routing_replay=False for this model.")
    # One copy per layer: (every forward's tokens, k), then cut back into forwards.
    per_layer = {layer: torch.cat(choices).cpu().split([c.shape[0] for c in choices]) for layer, choices in calls.items()}
    for step, chosen in enumerate(next(iter(per_layer.values()))):
        routes = torch.full((chosen.shape[0], slots, top_k), NO_ROUTE, dtype=torch.int16)
        for layer, steps in per_layer.items():
            routes[:, layer] = steps[step]
        forwards.append(routes)


def generation_routes(forwards: list[torch.Tensor], prompt_mask: torch.Tensor,
                      response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt routes (B, Lp, L, k), response routes (B, Lr, L, k)) from HF generate's forwards: the prefill
    over the (B, Lp) prompts, then one forward per decoding step whose input is response token t. Padding, the
    last response token and tokens after EOS route live when replayed (NO_ROUTE)."""
    (rows, prompt_width), response_width = prompt_mask.shape, response_mask.shape[1]
    prompt = forwards[0].reshape(rows, prompt_width, *forwards[0].shape[1:])
    prompt[~prompt_mask.bool().cpu()] = NO_ROUTE
    response = torch.full((rows, response_width, *prompt.shape[2:]), NO_ROUTE, dtype=torch.int16)
    steps = forwards[1:response_width]
    if steps:
        response[:, : len(steps)] = torch.stack([s.reshape(rows, *s.shape[1:]) for s in steps], dim=1)
    response[~response_mask.bool().cpu()] = NO_ROUTE
    return prompt, response


def routes_from_vllm(per_completion: list, rollout, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt routes (B, Lp, L, k), response routes (B, Lr, L, k)) from vLLM's `CompletionOutput.routed_experts`
    (positions, layers, k) of each completion (rows as in `rollout`). vLLM returns the positions before the last
    sampled token (which no forward consumed); they are aligned at that end, so any position it did not return
    routes live."""
    if any(routes is None for routes in per_completion):
        raise RuntimeError("vLLM returned no routed experts: the engine must start with enable_return_routed_experts "
                           "(VLLMEngine(return_routes=True)).")
    (rows, prompt_width), response_width = rollout.prompt_mask.shape, rollout.response_mask.shape[1]
    top_k = per_completion[0].shape[-1]
    prompt = torch.full((rows, prompt_width, slots, top_k), NO_ROUTE, dtype=torch.int16)
    response = torch.full((rows, response_width, slots, top_k), NO_ROUTE, dtype=torch.int16)
    for row, routes in enumerate(per_completion):
        p, r = int(rollout.prompt_mask[row].sum()), int(rollout.response_mask[row].sum())
        routes = torch.from_numpy(routes.astype("int16"))[:, :slots]
        if len(routes) > p + r - 1:
            raise RuntimeError(f"vLLM returned routes for {len(routes)} positions of a {p}-token prompt with a "
                               f"{r}-token response (at most {p + r - 1} ran through the model).")
        whole = torch.full((p + r, slots, top_k), NO_ROUTE, dtype=torch.int16)
        whole[p + r - 1 - len(routes) : p + r - 1] = routes
        prompt[row, prompt_width - p :], response[row, :r] = whole[:p], whole[p:]
    return prompt, response


class RoutingReplay:
    """Holds: forward hooks on the policy's routers (until `close()`), the routes being replayed (set only inside
    `replaying`), and on-device agreement counts since the last `take_metrics()`. No state_dict: no route
    outlives its `replaying` block."""

    _active = 0  # `replaying` blocks open in this process, over every instance

    def __init__(self, model):
        self.routers = moe_routers(model)
        self._routes: torch.Tensor | None = None  # (rows * positions, L, k) of the forward being run
        self._agree: torch.Tensor | int = 0
        self._total: torch.Tensor | int = 0
        # Hooks copied along with the model (copy.deepcopy of the policy: a reference) see routers not listed
        # here and leave them alone.
        self._own = {id(module) for modules in self.routers.values() for module in modules}
        self._hooks = [module.register_forward_hook(lambda m, _args, out, layer=layer: self._replay(m, layer, out))
                       for layer, modules in self.routers.items() for module in modules]

    def close(self) -> None:
        """Remove the hooks: the model routes live for good."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @contextlib.contextmanager
    def replaying(self, prompt_routes: torch.Tensor | None, response_routes: torch.Tensor | None):
        """Inside, every forward of the model over (rows, Lp + Lr) tokens routes as recorded. Keep the backward
        inside too: gradient checkpointing runs the routers again there. No routes: the model routes live."""
        if prompt_routes is None or response_routes is None or self._routes is not None:
            yield  # nothing recorded, or an outer `replaying` already holds this batch's routes
            return
        routes = torch.cat([prompt_routes, response_routes], dim=1)
        self._routes = routes.reshape(-1, *routes.shape[2:])
        RoutingReplay._active += 1
        try:
            yield
        finally:
            self._routes = None
            RoutingReplay._active -= 1

    def take_metrics(self) -> dict[str, float]:
        """{'moe/replay_agreement': the share of replayed (token, layer) choices, prompt and response tokens, that
        the live router made too}, over the forwards since the last call (not their recomputes in backward)."""
        total = int(self._total)
        if not total:
            return {}
        share = int(self._agree) / total
        self._agree = self._total = 0
        return {"moe/replay_agreement": share}

    def _replay(self, router, layer: int, out):
        in_backward = torch._C._current_graph_task_id() != -1
        if self._routes is None or id(router) not in self._own:
            if in_backward and not RoutingReplay._active and id(router) in self._own:
                raise RuntimeError("gradient checkpointing recomputed an MoE router outside RoutingReplay.replaying: "
                                   "run the backward inside the same `with replay.replaying(...)` as the forward.")
            return out
        logits, scores, live = out
        if self._routes.shape[0] != live.shape[0]:
            raise RuntimeError(f"routing replay holds routes for {self._routes.shape[0]} tokens, but the router of "
                               f"layer {layer} was called on {live.shape[0]}: replay a batch's routes only around "
                               f"a forward over that batch's prompt + response columns.")
        if self._routes.device != live.device:  # once per forward, at its first MoE layer, not once per layer
            self._routes = self._routes.to(live.device)
        recorded = self._routes[:, layer].long()
        replayed = (recorded != NO_ROUTE).all(dim=-1, keepdim=True)
        if not in_backward:
            with torch.no_grad():  # counted on the device: no host sync per layer
                same = (recorded.sort(dim=-1).values == live.sort(dim=-1).values).all(dim=-1)
                self._agree = self._agree + (same & replayed[:, 0]).sum()
                self._total = self._total + replayed.sum()
        indices = torch.where(replayed, recorded, live)
        return logits, replayed_scores(router, logits, indices, scores.dtype), indices


def _unwrapped(model):
    while hasattr(model, "module"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model
