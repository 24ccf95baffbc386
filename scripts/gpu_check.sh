#!/usr/bin/env bash
# GPU check for a single-H200 machine (the device tool): the official vLLM colocated with DeepSpeed ZeRO-3,
# sleep mode on, a ~0.5B-parameter Llama built from a config (no download), 20 GRPO steps of the demo task.
# Reports generation tokens/s, sync seconds and GB/s, and GPU memory; then, where trl is installed, rows a and b
# of benchmarks/vs_trl.py on a Qwen2.5-0.5B-shaped model, the GSM8K GRPO recipe for 30 steps, and MoE routing
# replay through vLLM's routed experts; and FSDP2 with colocated vLLM (sync figures, vLLM vs trainer log-prob
# gap); and the vLLM server on the same GPU, synchronous and one step off-policy with partial rollouts
# (staleness, partial share, log-prob agreement after in-flight updates). Aims to finish within 14 minutes.
#
#   bash scripts/gpu_check.sh            # from the repository root, on the GPU machine
#
# It needs torch (CUDA), transformers, accelerate, peft, datasets, deepspeed and the official vllm already
# installed there (the machine reaches no package registry); it says which are missing and stops.
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/verl_hf_gpu_check}
mkdir -p "$OUT"
START=$(date +%s)

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU"; exit 1; }
$PY - <<'PYEOF'
import importlib
missing = []
for name in ("torch", "transformers", "accelerate", "peft", "datasets", "deepspeed", "vllm", "evaluate"):
    try:
        print(f"{name:14s}", getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        missing.append(f"{name} ({type(e).__name__})")
if missing:
    raise SystemExit(f"missing: {', '.join(missing)}")
PYEOF
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== a ~0.5B Llama from a config, with the demo's character tokenizer"
$PY - "$OUT/model" <<'PYEOF'
import sys, torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from verl_hf.demo import WARM_START_DIR
tok = AutoTokenizer.from_pretrained(str(WARM_START_DIR))
config = LlamaConfig(vocab_size=len(tok), hidden_size=1536, intermediate_size=4096, num_hidden_layers=16,
                     num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=256,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     tie_word_embeddings=True, torch_dtype="bfloat16")
torch.manual_seed(0)
model = LlamaForCausalLM(config).to(torch.bfloat16)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
model.save_pretrained(sys.argv[1]); tok.save_pretrained(sys.argv[1])
PYEOF

echo "== GRPO, ZeRO-3 (1 process), colocated vLLM with sleep mode"
$PY -m accelerate.commands.launch --config_file examples/accelerate/zero3.yaml --num_processes 1 \
    --mixed_precision bf16 -m verl_hf.cli train examples/configs/demo.yaml \
    --model_name_or_path "$OUT/model" --output_dir "$OUT/run" --use_cpu false --bf16 true \
    --rollout_engine vllm --vllm_sleep_level 1 --vllm_gpu_memory_utilization 0.4 \
    --max_steps 20 --logging_steps 5 --eval_strategy no --save_strategy no \
    --per_device_train_batch_size 64 --gradient_accumulation_steps 2 --max_response_length 32 \
    2>&1 | tee "$OUT/train.log" | grep -E "Error|error|RL:|Traceback" | tail -20 || true

echo "== figures"
$PY - "$OUT/run/log_history.json" <<'PYEOF'
import json, sys
logs = [h for h in json.load(open(sys.argv[1])) if "time/rollout" in h]
mean = lambda k: sum(h[k] for h in logs if k in h) / max(sum(k in h for h in logs), 1)
for key in ("rollout/tokens_per_s", "time/rollout", "time/sync", "sync/seconds", "sync/gb_per_s",
            "sync/peak_extra_mb", "time/update", "reward/mean"):
    print(f"{key:24s} {mean(key):.4f}")
PYEOF
nvidia-smi --query-gpu=memory.used,memory.total --format=csv

echo "== FSDP2 (examples/accelerate/fsdp2.yaml, 1 process, bf16), colocated vLLM fed from the DTensor shards, 10 steps"
$PY -m accelerate.commands.launch --config_file examples/accelerate/fsdp2.yaml --num_processes 1 \
    --mixed_precision bf16 -m verl_hf.cli train examples/configs/demo.yaml \
    --model_name_or_path "$OUT/model" --output_dir "$OUT/fsdp2_run" --use_cpu false --bf16 true \
    --rollout_engine vllm --vllm_sleep_level 1 --vllm_gpu_memory_utilization 0.4 --rollout_is token \
    --max_steps 10 --logging_steps 5 --eval_strategy no --save_strategy no \
    --per_device_train_batch_size 64 --max_response_length 32 \
    > "$OUT/fsdp2.log" 2>&1 || { echo "FSDP2 run FAILED:"; grep -E "Error|Traceback" "$OUT/fsdp2.log" | tail -20; }
$PY - "$OUT/fsdp2_run/log_history.json" <<'PYEOF' || echo "FSDP2: no log (see $OUT/fsdp2.log)"
import json, sys
logs = [h for h in json.load(open(sys.argv[1])) if "sync/seconds" in h]
for key in ("sync/seconds", "sync/gb_per_s", "sync/peak_extra_mb", "rollout_is/logprob_gap_max", "time/rollout",
            "time/update", "reward/mean"):
    values = [h[key] for h in logs if key in h]
    print(f"fsdp2 {key:28s} mean {sum(values) / max(len(values), 1):.4f}  max {max(values, default=float('nan')):.4f}")
PYEOF

echo "== server mode: verl-hf vllm-serve on the same GPU, 10 GRPO steps (ZeRO-3, 1 process)"
# One GPU holds both the server and the trainer; NCCL refuses two ranks on one device, so this uses the
# gloo transport (the NCCL one needs the server on other GPUs).
$PY -m verl_hf.cli vllm-serve "$OUT/model" --port 8011 --host 127.0.0.1 --transfer verl_hf_gloo \
    --gpu-memory-utilization 0.3 --max-model-len 256 > "$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8011/health > /dev/null && break; sleep 2; done
$PY -m accelerate.commands.launch --config_file examples/accelerate/zero3.yaml --num_processes 1 \
    --mixed_precision bf16 -m verl_hf.cli train examples/configs/demo.yaml \
    --model_name_or_path "$OUT/model" --output_dir "$OUT/server_run" --use_cpu false --bf16 true \
    --rollout_engine vllm_server --vllm_server_url http://127.0.0.1:8011 \
    --max_steps 10 --logging_steps 5 --eval_strategy no --save_strategy no \
    --per_device_train_batch_size 64 --gradient_accumulation_steps 2 --max_response_length 32 \
    2>&1 | tee "$OUT/server_train.log" | grep -E "Error|error|Traceback" | tail -20 || true
echo "== asynchronous: the same run one step off-policy (max_staleness=1) with partial rollouts, same server"
# The producer samples the next round while ZeRO-3 updates; pushes land inside generations (vLLM's pause with
# abort, the unfinished responses continued with the new weights). rollout_is/mismatch_k1 is the engine's
# against the trainer's log-probs of the same tokens; async/partial_frac the responses that span two versions.
$PY -m accelerate.commands.launch --config_file examples/accelerate/zero3.yaml --num_processes 1 \
    --mixed_precision bf16 -m verl_hf.cli train examples/configs/demo.yaml \
    --model_name_or_path "$OUT/model" --output_dir "$OUT/async_run" --use_cpu false --bf16 true \
    --rollout_engine vllm_server --vllm_server_url http://127.0.0.1:8011 \
    --max_staleness 1 --partial_rollouts true --rollout_is token \
    --max_steps 10 --logging_steps 1 --eval_strategy no --save_strategy no \
    --per_device_train_batch_size 64 --gradient_accumulation_steps 2 --max_response_length 32 \
    2>&1 | tee "$OUT/async_train.log" | grep -E "Error|error|Traceback" | tail -20 || true
kill $SERVER || true
$PY - "$OUT/server_run/log_history.json" "$OUT/async_run/log_history.json" <<'PYEOF' || echo "async: no log (see $OUT/async_train.log)"
import json, sys
runtime = lambda path: next(h["train_runtime"] / h["step"] for h in json.load(open(path)) if "train_runtime" in h)
logs = [h for h in json.load(open(sys.argv[2])) if "async/staleness_max" in h]
print(f"async s/step {runtime(sys.argv[2]):.3f} (synchronous {runtime(sys.argv[1]):.3f}); staleness max "
      f"{max(h['async/staleness_max'] for h in logs):.0f} (bound 1)")
for key in ("async/staleness_mean", "async/partial_frac", "async/trainer_wait_s", "rollout_is/mismatch_k1"):
    print(f"async {key:24s} {sum(h[key] for h in logs) / len(logs):.4f}")
PYEOF
$PY - "$OUT/server_run/log_history.json" <<'PYEOF' || echo "server mode: no log (see $OUT/server.log)"
import json, sys
logs = [h for h in json.load(open(sys.argv[1])) if "time/rollout" in h]
for key in ("rollout/tokens_per_s", "sync/seconds", "sync/gb_per_s", "reward/mean"):
    print(f"server {key:24s} {sum(h[key] for h in logs) / len(logs):.4f}")
PYEOF
echo "== the GSM8K GRPO recipe as written (examples/recipes/gsm8k/grpo.yaml), 30 steps, official vLLM"
# No Hub here: a Qwen2.5-0.5B-shaped Qwen2 with random weights, the tests' BPE tokenizer with ChatML, and a
# local folder with GSM8K's columns through the recipe's own prepare.py; only source, model and steps differ.
$PY - "$OUT" <<'PYEOF' || echo "gsm8k stand-in FAILED"
import json, sys, torch
from pathlib import Path
sys.path.insert(0, "tests")
from architectures import build_tokenizer
from recipe_standins import gsm8k_like
from transformers import Qwen2Config, Qwen2ForCausalLM
out = Path(sys.argv[1]); tok = build_tokenizer()
config = Qwen2Config(vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=2048,
                     tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out / "qwen05b"); tok.save_pretrained(out / "qwen05b")
(out / "gsm8k_source").mkdir(exist_ok=True)
for split, n in (("train", 2048), ("test", 256)):
    (out / "gsm8k_source" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k_like(n, len(split))))
PYEOF
$PY examples/recipes/gsm8k/prepare.py --source "$OUT/gsm8k_source" --out "$OUT/gsm8k" || echo "gsm8k prepare FAILED"
timeout 300 $PY -m verl_hf.cli train examples/recipes/gsm8k/grpo.yaml --model_name_or_path "$OUT/qwen05b" \
    --dataset_name "$OUT/gsm8k" --output_dir "$OUT/gsm8k_run" --max_steps 30 --gradient_accumulation_steps 4 \
    --eval_steps 15 --per_device_eval_batch_size 256 --save_strategy no --logging_steps 5 \
    > "$OUT/gsm8k.log" 2>&1 || { echo "gsm8k recipe FAILED:"; grep -E "Error|Traceback" "$OUT/gsm8k.log" | tail -20; }
$PY - "$OUT/gsm8k_run/log_history.json" <<'PYEOF' || echo "gsm8k recipe: no log (see $OUT/gsm8k.log)"
import json, sys
logs = [h for h in json.load(open(sys.argv[1])) if "time/rollout" in h]
for key in ("reward/mean", "time/rollout", "time/sync", "time/update", "rollout/tokens_per_s"):
    print(f"gsm8k {key:24s} {sum(h.get(key, 0) for h in logs) / len(logs):.4f}")
print("gsm8k eval", [(h["step"], h.get("eval_accuracy")) for h in json.load(open(sys.argv[1])) if "eval_accuracy" in h])
PYEOF
echo "== MoE routing replay (R3) through colocated vLLM: the tests' tiny Qwen3-MoE, 2 GRPO steps on the GPU"
# vLLM returns routed experts only with its GPU model runner, so this path runs nowhere else.
timeout 150 $PY - "$OUT" <<'PYEOF' || echo "routing replay FAILED"
import json, sys
from pathlib import Path
sys.path.insert(0, "tests")
from architectures import build, build_tokenizer, check
out = Path(sys.argv[1])
path = build("qwen3_moe", out / "moe", build_tokenizer())
figures = check(path, out / "moe_run", rollout_engine="vllm", routing_replay=True, use_cpu=False)
keys = ("changed", "total", "mean_gap", "max_gap", "logged_k1", "replay_agreement")
print("routing replay", json.dumps({k: figures[k] for k in keys}))
# Misaligned routes (a position or a layer off) would show as an agreement far below 1.
assert figures["replay_agreement"] and min(figures["replay_agreement"]) > 0.9, figures["replay_agreement"]
assert figures["max_gap"] < 1e-3, figures["max_gap"]
PYEOF
echo "== vs TRL (benchmarks/vs_trl.py rows a and b) on a Qwen2.5-0.5B-shaped random model, if trl is installed"
# Row a: HF generate in both, bf16. Row b: each at its fastest on a GPU, both with colocated vLLM.
if $PY -c "import trl" 2>/dev/null; then
    timeout 300 $PY benchmarks/vs_trl.py --rows a --model qwen05b --pairs 3 --steps 4 | grep -v "^  row" || true
    timeout 300 $PY benchmarks/vs_trl.py --rows b --model qwen05b --pairs 2 --steps 4 \
        --set trl.use_vllm=true trl.vllm_mode=colocate trl.vllm_gpu_memory_utilization=0.3 | grep -v "^  row" || true
else
    echo "trl is not installed there: skipped (pip install -c constraints.txt -e '.[bench]')"
fi
echo "== done in $(( $(date +%s) - START )) s"
