"""Multi-turn rollouts on colocated vLLM: samples that advance on their own against turns in step.

The tool-using tiny Llama of tests/agent_model.py is built first (a short SFT, no download). Every
conversation plays up to three turns; each tool call sleeps a latency drawn uniformly from
[0, --max_latency] s before it answers. Both modes run the same rows on the same engine, alternating,
`--repeats` times each:
- in step: one batched generate call per turn, then every sample's tools at once (what HF generate does);
- independent: each sample's turn is a request of its own, the engine stepped for the requests as they come,
  so a sample whose tool is slow holds up no other (what both vLLM engines do).
The table gives conversations per second (median over repeats) and their ratio.

    python benchmarks/agent.py                                  # 16 prompts x 2 samples, latency 0-1 s
    python benchmarks/agent.py --hidden 1024 --layers 8         # turns that take longer than a tool call
    python benchmarks/agent.py --slow_share 0.1 --slow_s 5      # a long tail: one call in ten takes 5 s more
    python benchmarks/agent.py --prompts 32 --max_latency 0.5

With the tests' tiny model a turn takes milliseconds, so a round is bound by the tools alone: in step it waits
for the slowest call of every turn (the sum over turns of the maxima), independent for the slowest
conversation (the maximum over conversations of the sums), which caps the gain (1.17x for 32 conversations
of three U(0, 1) s calls). Where sampling a turn takes about as long as a tool call, independent rounds also
overlap one sample's sampling with another's tool; where tool latency has a long tail (real tools: a search
that times out, a slow sandbox), in step nearly every turn waits for a slow call.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DRAWS = random.Random(0)
DRAWS_LOCK = threading.Lock()
LATENCY = {"max": 1.0, "slow_share": 0.0, "slow_s": 0.0}


def echo(text: str) -> str:
    """Repeat the text, after a while.

    Args:
        text: What to repeat.
    """
    with DRAWS_LOCK:
        latency = DRAWS.uniform(0.0, LATENCY["max"])
        if DRAWS.random() < LATENCY["slow_share"]:  # a long tail: a search that times out, a slow sandbox
            latency += LATENCY["slow_s"]
    time.sleep(latency)
    return text


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2, help="conversations per prompt")
    parser.add_argument("--max_latency", type=float, default=1.0, help="each tool call sleeps U(0, this) s")
    parser.add_argument("--slow_share", type=float, default=0.0, help="the share of calls that take --slow_s more")
    parser.add_argument("--slow_s", type=float, default=5.0)
    parser.add_argument("--max_turns", type=int, default=3)
    parser.add_argument("--new_tokens", type=int, default=16, help="the most tokens one turn samples")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128, help="the model's width (128: the tests' tiny model, "
                        "whose turns take a few ms; wider ones take about as long as a tool call)")
    parser.add_argument("--layers", type=int, default=2)
    return parser.parse_args()


def build_actor(directory: str, args):
    import torch
    from agent_model import build_tool_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_hf import Actor
    from verl_hf.rollout import eos_token_ids
    from verl_hf.rollout.vllm_engine import VLLMEngine

    sizes = {} if args.hidden == 128 and args.layers == 2 else dict(
        hidden_size=args.hidden, intermediate_size=args.hidden * 2, num_hidden_layers=args.layers)
    path = build_tool_model(Path(directory), **sizes)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(model.config, tokenizer.pad_token_id, eos_token_ids(model, tokenizer), max_model_len=256,
                        kv_cache_memory_bytes=2**27)
    return Actor(model, tokenizer, engine=engine), tokenizer


def play(actor, rollout, rows, args, independent: bool, seed: int) -> tuple[float, dict]:
    """(seconds, the loop's metrics) of one round of conversations in the given mode."""
    actor.engine.serves_requests_concurrently = independent
    started = time.perf_counter()
    _, metrics = actor.generate_conversations(rollout, rows, max_new_tokens=args.new_tokens,
                                              num_return_sequences=args.samples, seed=seed)
    return time.perf_counter() - started, metrics


def main() -> None:
    args = parse()
    LATENCY.update(max=args.max_latency, slow_share=args.slow_share, slow_s=args.slow_s)
    from agent_model import chat_rows, every_turn_calls_echo

    from verl_hf.agent import MultiTurnRollout, ToolEnvironment, as_tools

    with tempfile.TemporaryDirectory() as directory:
        actor, tokenizer = build_actor(directory, args)
        tools = as_tools([echo])
        rollout = MultiTurnRollout(lambda: ToolEnvironment(tools, every_turn_calls_echo, max_tool_calls=8),
                                   tokenizer, None, max_turns=args.max_turns, max_tokens=160, env_timeout_s=60)
        rows = chat_rows(tokenizer, args.prompts)
        play(actor, rollout, rows[:2], args, True, seed=-1)  # warm-up (and the first weight sync)
        seconds = {False: [], True: []}
        turns = {}
        for repeat in range(args.repeats):
            for independent in (False, True):
                took, metrics = play(actor, rollout, rows, args, independent, seed=repeat)
                seconds[independent].append(took)
                turns[independent] = metrics["turns/mean"]
    conversations = args.prompts * args.samples
    rate = {mode: conversations / statistics.median(s) for mode, s in seconds.items()}
    tail = f" + {args.slow_s} s for {args.slow_share:.0%} of calls" if args.slow_share else ""
    print(f"{conversations} conversations, up to {args.max_turns} turns, tool latency U(0, {args.max_latency}) s"
          f"{tail}, model hidden {args.hidden} x {args.layers} layers, median of {args.repeats}")
    print("| mode | turns/mean | seconds per round | conversations/s |")
    print("|---|---:|---:|---:|")
    for independent, name in ((False, "in step"), (True, "independent")):
        print(f"| {name} | {turns[independent]:.2f} | {statistics.median(seconds[independent]):.2f} | "
              f"{rate[independent]:.2f} |")
    print(f"independent / in step: {rate[True] / rate[False]:.2f}x")


if __name__ == "__main__":
    main()
