"""Publishing the actor: save_model / push_to_hub write weights (or the adapter, or the merged model), the
tokenizer, verl_config.json and a model card. The Hub is unreachable here, so the only fake is at the HTTP
boundary: huggingface_hub's httpx client gets a transport that records the requests and answers as the Hub."""

import base64
import json
from pathlib import Path

import httpx
import pytest
import torch

from conftest import small_config
from verl_hf import VerlTrainer
from verl_hf.callbacks import PushToHubCallback
from verl_hf.publish import model_card

SNAPSHOT = Path(__file__).with_name("snapshots") / "model_card.md"


class FakeHub:
    """Answers create-repo, validate-yaml, preupload and commit like the Hub; keeps every committed file."""

    def __init__(self):
        self.commits: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/repos/create":
            return httpx.Response(200, json={"url": "https://huggingface.co/me/tiny-grpo", "name": "me/tiny-grpo"})
        if path == "/api/validate-yaml":
            return httpx.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:
            files = json.loads(request.content)["files"]
            return httpx.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})
        if "/commit/" in path:
            lines = [json.loads(line) for line in request.content.decode().splitlines() if line]
            header = next(line["value"] for line in lines if line["key"] == "header")
            files = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
                     for line in lines if line["key"] == "file"}
            self.commits.append({"message": header["summary"], "files": files})
            return httpx.Response(200, json={"commitUrl": "https://huggingface.co/me/tiny-grpo/commit/1",
                                             "commitOid": "a" * 40, "pullRequestUrl": None})
        return httpx.Response(200, json={})  # telemetry and the like


@pytest.fixture
def hub(monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    fake = FakeHub()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(fake)))
    yield fake
    huggingface_hub.set_client_factory(httpx.Client)


def _trainer(tmp_path, warm_start_dir, addition, **overrides):
    args = small_config(tmp_path, hub_model_id="me/tiny-grpo", hub_token="hf_test", **overrides)
    return VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0],
                       eval_dataset=addition[1].select(range(40)))


def test_push_to_hub_uploads_the_actor_config_and_card(tmp_path, warm_start_dir, addition, hub):
    from safetensors.torch import load

    trainer = _trainer(tmp_path, warm_start_dir, addition, max_steps=2)
    trainer.train()
    trainer.evaluate()
    trainer.push_to_hub()
    files = hub.commits[-1]["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json", "verl_config.json", "README.md"} <= set(files)
    uploaded = load(files["model.safetensors"])
    for name, param in trainer.model.named_parameters():
        if name in uploaded:
            assert torch.equal(uploaded[name], param.detach().cpu()), name
    config = json.loads(files["verl_config.json"])
    assert config["algorithm"] == "GRPO" and config["steps"] == 2
    assert config["rewards"] == [{"name": "gsm8k", "weight": 1.0}, {"name": "gsm8k_format", "weight": 0.1}]
    assert config["library_versions"]["torch"] == torch.__version__ and config["config"]["hub_token"] != "hf_test"
    assert config["data"]["train"]["rows"] == len(addition[0])
    card = files["README.md"].decode()
    assert "trained with **GRPO** for 2 optimizer steps" in card
    assert "| gsm8k | 1 |" in card and "| gsm8k_format | 0.1 |" in card
    assert f"{config['metrics']['eval_reward']:.4g}" in card  # the held-out total


def test_peft_actor_saves_adapter_or_merged_model(tmp_path, warm_start_dir, addition):
    """Either save reloads with transformers / peft alone to the trained model's logits (atol 1e-5)."""
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    for merged in (False, True):
        out = tmp_path / f"merged_{merged}"
        args = small_config(out, max_steps=1, save_merged_model=merged)
        trainer = VerlTrainer(model=warm_start_dir, args=args, train_dataset=addition[0], peft_config=lora)
        trainer.train()
        trainer.save_model()
        saved = set(p.name for p in (out / "out").iterdir())
        assert "verl_config.json" in saved
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        with torch.no_grad():
            expected = trainer.accelerator.unwrap_model(trainer.model)(input_ids=ids).logits
        if not merged:  # the adapter alone, on the base it was trained from: the trained model's logits
            assert {"adapter_config.json", "adapter_model.safetensors"} <= saved
            reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(warm_start_dir), out / "out")
            with torch.no_grad():
                logits = reloaded(input_ids=ids).logits
                assert torch.allclose(logits, expected, atol=1e-5)
                with reloaded.disable_adapter():  # and the adapter is what makes them
                    assert not torch.allclose(logits, reloaded(input_ids=ids).logits, atol=1e-3)
            continue
        assert "model.safetensors" in saved and "adapter_config.json" not in saved
        plain = AutoModelForCausalLM.from_pretrained(out / "out")
        with torch.no_grad():
            assert torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-5)
        card_info = json.loads((out / "out" / "verl_config.json").read_text())
        assert card_info["peft"] is False  # merged: loads as a plain transformers model


def test_merged_save_with_push_every_save_is_refused(tmp_path):
    from verl_hf import VerlConfig

    with pytest.raises(ValueError, match="save_merged_model with push_to_hub=True"):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, save_merged_model=True, push_to_hub=True,
                   hub_model_id="me/x")


def test_push_to_hub_callback_publishes_at_intervals(tmp_path, warm_start_dir, addition, hub):
    callback = PushToHubCallback(every_n_steps=1)
    trainer = _trainer(tmp_path, warm_start_dir, addition, max_steps=2)
    trainer.add_callback(callback)
    trainer.train()
    assert callback.pushed_steps == [1, 2]
    assert [c["message"] for c in hub.commits] == ["verl_hf: step 1", "verl_hf: step 2"]
    assert all("verl_config.json" in c["files"] for c in hub.commits)
    with pytest.raises(ValueError, match="needs hub_model_id"):
        VerlTrainer(model=warm_start_dir, args=small_config(tmp_path / "x"), train_dataset=addition[0],
                    callbacks=[PushToHubCallback()])


CARD_INFO = {
    "algorithm": "PPO-Lagrangian (Safe-RLHF)", "base_model": "Qwen/Qwen2.5-0.5B-Instruct", "peft": True, "steps": 600,
    "rewards": [{"name": "reward_model", "weight": 1.0}, {"name": "length", "weight": 0.01}],
    "costs": ["cost_model"], "lagrange_lambda": 0.331,
    "data": {"train": {"name": "PKU-Alignment/PKU-SafeRLHF", "rows": 27000}, "eval": None},
    "metrics": {"reward/reward_model/mean": 1.25, "reward/length/mean": 87.5, "reward/mean": 2.125,
                "eval_reward": 2.0, "eval_reward/reward_model": 1.1, "cost/unsafe_rate": 0.03,
                "eval_unsafe_rate": 0.04},
    "config": {"learning_rate": 1e-06, "num_generations": 1, "per_device_train_batch_size": 16,
               "max_response_length": 512, "kl_coef": 0.02, "cost_limit": 0.0},
}


def test_model_card_snapshot():
    """The generated card for a fixed run description; regenerate with VERL_HF_UPDATE_SNAPSHOTS=1."""
    import os

    card = model_card(CARD_INFO, "me/safe-qwen")
    if os.environ.get("VERL_HF_UPDATE_SNAPSHOTS"):
        SNAPSHOT.write_text(card)
    assert card == SNAPSHOT.read_text()


def _says_four(completions, **kwargs):
    return [float("4" in c) for c in completions]


def test_a_config_with_functions_serializes_with_their_names(tmp_path):
    """Reward functions given as functions (not "module:function" strings) are written by name: the config's
    JSON (verl_config.json, the trackers) used to fail on them, and save_model with it."""
    from verl_hf import VerlConfig

    args = VerlConfig(output_dir=str(tmp_path), use_cpu=True, reward_funcs=[_says_four, "gsm8k"],
                      reward_weights=[1.0, 0.5])
    assert json.loads(args.to_json_string())["reward_funcs"] == ["test_publish:_says_four", "gsm8k"]
    assert args.reward_funcs[0] is _says_four  # the run itself keeps the function
