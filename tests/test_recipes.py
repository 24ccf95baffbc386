"""examples/recipes run offline on tiny stand-ins through the very code path of the real run: the recipe's own
data preparation on a local folder with the real dataset's columns, then `verl-hf train <recipe>.yaml` on a
locally built model of the real model's architecture (Qwen2 for Qwen2.5-0.5B-Instruct). Only the source, the
model and the sizes differ (command-line overrides); every recipe file also validates as written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from architectures import build, build_tokenizer
from recipe_standins import geometry3k_like, gsm8k_like, hh_like, safe_rlhf_like, save_score_model
from verl_hf.cli import parse_config

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "examples" / "recipes"
SIZES = ["--rollout_engine", "hf", "--use_cpu", "true", "--bf16", "false", "--gradient_checkpointing", "false",
         "--max_steps", "2", "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
         "--max_prompt_length", "160", "--max_response_length", "16", "--eval_steps", "2",
         "--per_device_eval_batch_size", "8", "--save_strategy", "no", "--logging_steps", "1"]
SIZES_PER_RECIPE = {"gsm8k/ppo": ["--generation_batch_size", "16"],  # 2 optimizer steps per round, as the recipe
                    "geometry3k/grpo": ["--per_device_train_batch_size", "10"]}  # 2 prompts x its 5 samples


def prepare(recipe: str, rows: dict, tmp_path_factory, stdout: str) -> str:
    """Run examples/recipes/<recipe>/prepare.py on a local folder holding `rows` per split; the saved path."""
    source, out = tmp_path_factory.mktemp(f"{recipe}_source"), tmp_path_factory.mktemp(recipe) / "prompts"
    for split, split_rows in rows.items():
        (source / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split_rows))
    cmd = [sys.executable, str(RECIPES / recipe / "prepare.py"), "--source", str(source), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stdout in done.stdout, done.stdout
    return str(out)


def colocated_vllm_defaults(recipe: str) -> list[str]:
    """The stand-in samples with the HF engine, where the recipe's vLLM sizing would be refused as having no
    effect: those fields back at their defaults."""
    import dataclasses

    from verl_hf.cli import load_yaml
    from verl_hf.config import COLOCATED_VLLM, FIELD_APPLIES, VerlConfig

    written = load_yaml(RECIPES / f"{recipe}.yaml")  # with its base_config
    defaults = {f.name: f.default for f in dataclasses.fields(VerlConfig)}
    return [arg for name in written if FIELD_APPLIES.get(name) is COLOCATED_VLLM
            for arg in (f"--{name}", str(defaults[name]))]


def train(recipe: str, overrides: list[str], tmp_path) -> dict:
    """`verl-hf train examples/recipes/<recipe>.yaml` with the stand-in's overrides; its summary.json, with
    the log history under "history"."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "verl_hf.cli", "train", str(RECIPES / f"{recipe}.yaml"), "--output_dir", str(out),
           *overrides, *SIZES, *SIZES_PER_RECIPE.get(recipe, []), *colocated_vllm_defaults(recipe)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    history = json.loads((out / "log_history.json").read_text())
    assert any("reward/mean" in h for h in history)
    return dict(json.loads((out / "summary.json").read_text()), history=history)


@pytest.fixture(scope="module")
def gsm8k_prompts(tmp_path_factory):
    """The recipe's prepare.py run on a local stand-in folder (train.jsonl, test.jsonl)."""
    return prepare("gsm8k", {"train": gsm8k_like(48, 0), "test": gsm8k_like(8, 1)}, tmp_path_factory,
                   "train 48 prompts, test 8 prompts")


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    return build("qwen2", tmp_path_factory.mktemp("qwen2"), build_tokenizer())


def test_gsm8k_prepare_writes_chat_prompts_with_the_instruction(gsm8k_prompts):
    from datasets import load_from_disk

    data = load_from_disk(gsm8k_prompts)
    row = data["train"][0]
    assert data["train"].column_names == ["answer", "prompt"] and len(data["test"]) == 8
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith('final answer after "####".')
    assert row["answer"].split("#### ")[-1].isdigit()


def test_gsm8k_prepare_names_a_missing_column(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "#### 2"}) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({"problem": "2+2?", "answer": "#### 4"}) + "\n")
    cmd = [sys.executable, str(RECIPES / "gsm8k" / "prepare.py"), "--source", str(tmp_path), "--out",
           str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "lacks the column(s) ['question']" in done.stderr


@pytest.mark.parametrize("recipe", ["grpo", "ppo", "remax"])
def test_gsm8k_recipe_trains_on_the_stand_in(recipe, gsm8k_prompts, tiny_qwen2, tmp_path):
    summary = train(f"gsm8k/{recipe}", ["--model_name_or_path", tiny_qwen2, "--dataset_name", gsm8k_prompts], tmp_path)
    assert summary["steps"] == 2 and 0 <= summary["accuracy_after"] <= 1, summary


def save_random(model_class, config_class, tokenizer_path: str, directory, seed: int, **sizes) -> str:
    """A model of `model_class` with random weights (`seed`) and the tokenizer at `tokenizer_path`, saved."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    model = model_class(config_class(vocab_size=len(tokenizer), head_dim=64, pad_token_id=tokenizer.pad_token_id,
                                     **sizes))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def tiny_qwen2_teacher(tmp_path_factory, tiny_qwen2):
    """A larger Qwen2 (as Qwen2.5-1.5B-Instruct is to the 0.5B student) with the student's tokenizer, random."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    return save_random(Qwen2ForCausalLM, Qwen2Config, tiny_qwen2, tmp_path_factory.mktemp("teacher"), seed=2,
                       hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                       eos_token_id=AutoTokenizer.from_pretrained(tiny_qwen2).eos_token_id)


@pytest.mark.parametrize("recipe", ["reverse_kl", "gkd"])
def test_distill_recipe_trains_on_the_stand_in(recipe, gsm8k_prompts, tiny_qwen2, tiny_qwen2_teacher, tmp_path):
    """The GSM8K prompts of ../gsm8k/prepare.py, a tiny Qwen2 student, a larger tiny Qwen2 teacher: the
    distillation signal is logged every step and evaluation reports the held-out student-teacher KL."""
    summary = train(f"distill/{recipe}", ["--model_name_or_path", tiny_qwen2, "--dataset_name", gsm8k_prompts,
                                          "--teacher_model_path", tiny_qwen2_teacher], tmp_path)
    assert summary["steps"] == 2, summary
    logged = [h for h in summary["history"] if "reward/mean" in h]
    # the sampled tokens' log-ratio (reverse_kl) may fall either side of 0 on two steps; GKD's divergence is >= 0
    assert len(logged) == 2 and all(h[f"distill/{recipe}"] != 0 for h in logged), logged
    assert recipe != "gkd" or all(h["distill/gkd"] > 0 for h in logged), logged
    assert any(h.get("eval_distill_kl", 0) > 0 for h in summary["history"]), summary["history"]


@pytest.fixture(scope="module")
def hh_prompts(tmp_path_factory):
    return prepare("hh_rlhf", {"train": hh_like(32, 0), "test": hh_like(8, 1)}, tmp_path_factory,
                   "train 32 prompts, test 8 prompts")


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory, tiny_qwen2):
    """A Qwen3 sequence-classification model (the architecture of Skywork-Reward-V2-Qwen3-0.6B), random."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    return save_random(Qwen3ForSequenceClassification, Qwen3Config, tiny_qwen2, tmp_path_factory.mktemp("reward_model"),
                       seed=1, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, num_labels=1)


def test_hh_rlhf_prepare_splits_the_turns(hh_prompts):
    from datasets import load_from_disk

    data = load_from_disk(hh_prompts)
    assert data["train"].column_names == ["prompt"]
    assert data["train"][0]["prompt"] == [{"role": "user", "content": "What is 0 plus 0?"}]
    assert [m["role"] for m in data["train"][1]["prompt"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("recipe", ["ppo", "remax"])
def test_hh_rlhf_recipe_trains_on_the_stand_in(recipe, hh_prompts, tiny_qwen2, tiny_reward_model, tmp_path):
    summary = train(f"hh_rlhf/{recipe}", ["--model_name_or_path", tiny_qwen2, "--dataset_name", hh_prompts,
                                          "--reward_model_path", tiny_reward_model], tmp_path)
    assert summary["steps"] == 2, summary


@pytest.fixture(scope="module")
def beaver_like(tmp_path_factory, tiny_qwen2):
    """Tiny reward and cost models saved in safe-rlhf's own format, converted by the recipe's script."""
    from transformers import AutoTokenizer

    tokenizer, root = AutoTokenizer.from_pretrained(tiny_qwen2), tmp_path_factory.mktemp("beaver")
    paths = {}
    for seed, kind in enumerate(("reward", "cost")):
        save_score_model(root / f"{kind}_safe_rlhf", tokenizer, kind, seed=seed)
        paths[kind] = str(root / kind)
        cmd = [sys.executable, str(RECIPES / "safe_rlhf" / "convert_score_model.py"), str(root / f"{kind}_safe_rlhf"),
               paths[kind]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    return root, paths


def test_converted_score_model_equals_safe_rlhf_end_scores(beaver_like):
    """safe-rlhf's end_scores: prompt + answer + EOS, score_head on the hidden state of each row's last
    non-padding token. Right padding (as safe-rlhf pads), rows of different lengths."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, LlamaModel

    root, paths = beaver_like
    source = root / "reward_safe_rlhf"
    tokenizer = AutoTokenizer.from_pretrained(paths["reward"])
    tokenizer.padding_side = "right"
    assert tokenizer("x")["input_ids"][-1] == tokenizer.eos_token_id  # the converted tokenizer appends EOS
    assert AutoTokenizer.from_pretrained(source)("x")["input_ids"][-1] != tokenizer.eos_token_id
    enc = tokenizer(["BEGINNING OF CONVERSATION: USER: hi ASSISTANT: hello there", "short"], return_tensors="pt",
                    padding=True)
    assert enc["attention_mask"][1, -1] == 0  # the short row really is padded on the right
    weights = load_file(source / "model.safetensors")
    backbone = LlamaModel(LlamaConfig.from_pretrained(source))
    backbone.load_state_dict({k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")})
    with torch.no_grad():
        hidden = backbone(**enc).last_hidden_state
        last = torch.tensor([m.nonzero()[-1].item() for m in enc["attention_mask"]])
        expected = hidden[torch.arange(2), last] @ weights["score_head.weight"].T
        converted = AutoModelForSequenceClassification.from_pretrained(paths["reward"])
        got = converted(**enc).logits
    assert torch.allclose(got, expected, atol=1e-5), (got, expected)


@pytest.mark.parametrize("fields, said", [({"do_normalize": True}, "do_normalize is on"),
                                          ({"bias": True}, "a sequence-classification head has one output and no bias"),
                                          ({"model_type": "gpt2"}, "this converter handles Llama score models")])
def test_score_model_conversion_refuses_what_it_cannot_keep(tmp_path, tiny_qwen2, fields, said):
    from transformers import AutoTokenizer

    save_score_model(tmp_path / "model", AutoTokenizer.from_pretrained(tiny_qwen2), "reward", **fields)
    cmd = [sys.executable, str(RECIPES / "safe_rlhf" / "convert_score_model.py"), str(tmp_path / "model"),
           str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]


def test_safe_rlhf_recipe_trains_on_the_stand_in(beaver_like, tmp_path_factory, tmp_path):
    prompts = prepare("safe_rlhf", {"train": safe_rlhf_like(32, 0), "test": safe_rlhf_like(8, 1)}, tmp_path_factory,
                      "train 16 prompts, test 4 prompts")  # duplicates dropped
    policy = build("llama", tmp_path_factory.mktemp("alpaca_like"), build_tokenizer())  # Alpaca-7B is a Llama
    _, paths = beaver_like
    summary = train("safe_rlhf/ppo_lagrangian", ["--model_name_or_path", policy, "--dataset_name", prompts,
                                                 "--reward_model_path", paths["reward"],
                                                 "--critic_model_path", paths["reward"],
                                                 "--cost_model_path", paths["cost"]], tmp_path)
    assert summary["steps"] == 2, summary
    logged = [h for h in summary["history"] if "cost/mean" in h]
    assert len(logged) == 2 and all("safety/lambda" in h for h in logged), logged


def test_reward_critic_starts_from_the_reward_model(beaver_like, tiny_qwen2, tmp_path):
    """critic_model_path: the critic is the converted reward model, its score head included (Safe-RLHF)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification

    from conftest import small_config
    from verl_hf import VerlTrainer

    _, paths = beaver_like
    args = small_config(tmp_path, adv_estimator="gae", critic_model_path=paths["reward"], max_steps=1,
                        reward_funcs=None, reward_weights=None, reward_model_path=[paths["reward"]])
    trainer = VerlTrainer(model=tiny_qwen2, args=args, train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 8))
    reward = AutoModelForSequenceClassification.from_pretrained(paths["reward"])
    assert torch.equal(trainer.critic.model.score.weight, reward.score.weight)
    with pytest.raises(ValueError, match="critic_model_path=.*takes effect only when adv_estimator='gae'"):
        small_config(tmp_path, critic_model_path=paths["reward"])  # GRPO: no critic to start


@pytest.fixture(scope="module")
def geometry3k_prompts(tmp_path_factory):
    """The recipe's prepare.py run on a local parquet folder with Geometry3K's columns (figures as PNG bytes)."""
    from datasets import Dataset

    source, out = tmp_path_factory.mktemp("geometry3k_source"), tmp_path_factory.mktemp("geometry3k") / "prompts"
    for split, rows in {"train": geometry3k_like(16, 0), "test": geometry3k_like(8, 1)}.items():
        Dataset.from_list(rows).to_parquet(str(source / f"{split}.parquet"))
    cmd = [sys.executable, str(RECIPES / "geometry3k" / "prepare.py"), "--source", str(source), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train 16 prompts, test 8 prompts" in done.stdout, done.stdout
    return str(out)


def test_geometry3k_prepare_puts_the_figure_where_its_marker_was(geometry3k_prompts):
    from datasets import load_from_disk

    from verl_hf.vision.images import row_images

    row = load_from_disk(geometry3k_prompts)["test"][0]
    parts = row["prompt"][0]["content"]
    assert [p["type"] for p in parts] == ["image", "text", "text"] and "\\boxed{}" in parts[-1]["text"]
    assert parts[1]["text"] == "Find the measure of angle A." and row["answer"] in ("30", "45", "60", "90")
    assert row_images(row, "images", "test row 0")[0].size[1] == 56  # the figure reads back from its bytes


def test_geometry3k_recipe_trains_a_tiny_qwen2_5_vl_on_the_stand_in(geometry3k_prompts, tmp_path):
    """The recipe as written but for the model (a tiny random-weight Qwen2.5-VL with a processor built locally),
    the sizes and the HF engine: two GRPO steps on image prompts, evaluated before and after."""
    import importlib.util

    from verl_hf.demo.tiny_vision import build_tiny_qwen2_5_vl, build_vision_processor

    spec = importlib.util.spec_from_file_location("geometry3k_prepare", RECIPES / "geometry3k" / "prepare.py")
    prepare_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare_module)
    processor = build_vision_processor([prepare_module.INSTRUCTION, "Find the measure of angle A. 30 45 60 90"],
                                       vocab_size=400)
    build_tiny_qwen2_5_vl(processor).save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    summary = train("geometry3k/grpo", ["--model_name_or_path", str(tmp_path / "model"), "--dataset_name",
                                        geometry3k_prompts], tmp_path)
    assert summary["steps"] == 2 and 0 <= summary["accuracy_after"] <= 1, summary


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_recipe_validates_as_written(path):
    """The real run's settings, unchanged: a Hub model id, vLLM, and a config VerlConfig accepts."""
    script, config = parse_config(str(path), [])
    assert "/" in script.model_name_or_path and not Path(script.model_name_or_path).exists()
    assert config.rollout_engine == "vllm" and config.max_steps > 0
