"""Dropout off for real in every role (verl_hf/roles/dropout.py), on tiny random models of the three kinds of
dropout transformers applies: Seed-OSS (functional dropout with rates its modules cached from the config),
GPT-2 (nn.Dropout modules) and Falcon (functional dropout reading the config at every forward). Each model
is first shown to be random in training mode (so the checks can fail), then repeatable once a role holds it.
The architecture matrix (tests/test_architectures.py) trains Seed-OSS and GPT-2 on every engine."""

import json

import pytest
import torch

from architectures import build_tokenizer

# model_type -> the config's dropout fields, all on (Falcon and GPT-2 read some at forward time)
DROPOUT_ON = {
    "seed_oss": dict(attention_dropout=0.1, residual_dropout=0.1, head_dim=64, num_key_value_heads=1),
    "gpt2": dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1),
    "falcon": dict(attention_dropout=0.1, hidden_dropout=0.1, new_decoder_architecture=False, multi_query=True),
}


@pytest.fixture(scope="module")
def tokenizer_():
    return build_tokenizer()


def tiny(model_type: str, tokenizer, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                                  num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                  **DROPOUT_ON[model_type], **extra)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def training_forwards_agree(model) -> bool:
    model.train()
    ids = torch.arange(3, 19).view(2, 8)
    with torch.no_grad():
        return torch.equal(model(ids).logits, model(ids).logits)


@pytest.mark.parametrize("model_type", DROPOUT_ON)
def test_the_actor_gives_identical_training_mode_log_probs(model_type, tokenizer_):
    from verl_hf import Actor

    model = tiny(model_type, tokenizer_)
    assert not training_forwards_agree(model)  # dropout is really on before a role takes the model
    actor = Actor(model, tokenizer=tokenizer_)
    batch = actor.generate_sequences(prompt_ids=[[5, 6, 7], [8, 9, 10, 11]], max_new_tokens=6,
                                     num_return_sequences=2)
    with torch.no_grad():
        first, second = actor.compute_logprobs(batch)[0], actor.compute_logprobs(batch)[0]
    assert model.training and torch.equal(first, second)
    assert torch.allclose(first * batch.response_mask, actor.get_logprobs(batch) * batch.response_mask, atol=1e-6)


def test_every_role_turns_dropout_off(tokenizer_, tmp_path):
    """The critic (trained in training mode), the reference and a reward model, each from Seed-OSS (the heads'
    own dropout included)."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from verl_hf import Critic, ReferencePolicy, RewardModel

    tiny("seed_oss", tokenizer_).save_pretrained(tmp_path)
    models = {Critic: AutoModelForTokenClassification.from_pretrained(tmp_path, num_labels=1),
              ReferencePolicy: tiny("seed_oss", tokenizer_),
              RewardModel: AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=1)}
    for role, model in models.items():
        assert not training_forwards_agree(model), role.__name__  # random before the role takes it
        assert training_forwards_agree(role(model, tokenizer=tokenizer_).model), role.__name__


def test_saved_configs_keep_the_rates_the_model_was_built_with(tokenizer_, tmp_path):
    """Training runs without dropout, but what verl_hf saves says what the model was built with: a role's
    save_pretrained, the critic's checkpoints, the merged LoRA model. A rate set again after a role zeroed it is
    the one a later role remembers."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForTokenClassification

    from verl_hf import Actor, Critic
    from verl_hf.publish import save_merged

    def saved_rates(folder):
        config = json.loads((folder / "config.json").read_text())
        return config["attention_dropout"], config["residual_dropout"]

    actor = Actor(tiny("seed_oss", tokenizer_), tokenizer=tokenizer_)
    actor.save_pretrained(str(tmp_path / "actor"))
    assert saved_rates(tmp_path / "actor") == (0.1, 0.1)
    assert actor.model.config.attention_dropout == 0.0 and training_forwards_agree(actor.model)

    actor.model.config.attention_dropout = 0.2  # the user sets it again, then builds another role
    Actor(actor.model, tokenizer=tokenizer_).save_pretrained(str(tmp_path / "again"))
    assert saved_rates(tmp_path / "again") == (0.2, 0.1) and actor.model.config.attention_dropout == 0.0

    tiny("seed_oss", tokenizer_).save_pretrained(tmp_path / "base")
    critic = Critic(AutoModelForTokenClassification.from_pretrained(tmp_path / "base", num_labels=1), tokenizer_)
    critic.save_checkpoint(str(tmp_path / "critic"))
    assert saved_rates(tmp_path / "critic") == (0.1, 0.1)

    lora = get_peft_model(tiny("seed_oss", tokenizer_), LoraConfig(r=2, target_modules=["q_proj"]))
    Actor(lora, tokenizer=tokenizer_)
    save_merged(lora, str(tmp_path / "merged"), is_deepspeed=False)
    assert saved_rates(tmp_path / "merged") == (0.1, 0.1) and lora.config.attention_dropout == 0.0


def test_randomness_without_a_rate_is_refused_and_rates_that_act_in_eval_are_kept(tokenizer_, caplog):
    """PhiMoE: its router samples experts at random in training mode (refused for the actor, a warning for the
    reference, which runs in eval mode), and its router_jitter_noise is a fixed cutoff that eval mode and vLLM
    use too: left as it is, so eval-mode logits do not change."""
    from transformers import AutoModelForCausalLM, PhimoeConfig

    from verl_hf import Actor, ReferencePolicy

    config = PhimoeConfig(vocab_size=len(tokenizer_), hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                          max_position_embeddings=64, input_jitter_noise=0.1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.arange(3, 19).view(2, 8)
    with torch.no_grad():
        before = model(ids).logits
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.router \(PhiMoE's router \(sparsemixer\)"):
        Actor(model, tokenizer=tokenizer_)
    ReferencePolicy(model, tokenizer_)
    assert "only runs in eval mode" in caplog.text
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    router = model.model.layers[0].mlp.router
    assert model.config.router_jitter_noise == router.router_jitter_noise == 0.01
    assert model.config.input_jitter_noise == router.input_jitter_noise == 0.0


def test_a_rate_that_cannot_be_set_is_refused_by_name(tokenizer_):
    from verl_hf import Actor

    class FixedRate(torch.nn.Module):
        @property
        def attention_dropout(self):  # read-only: nothing can turn it off
            return 0.1

    model = tiny("seed_oss", tokenizer_)
    model.model.layers[1].self_attn.add_module("fixed", FixedRate())
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.fixed\.attention_dropout=0\.1"):
        Actor(model, tokenizer=tokenizer_)


def test_the_rates_are_found_by_name_and_kind():
    from verl_hf.roles.dropout import disable_dropout

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop_path_rate, self.layer_dropouts, self.use_dropout = 0.2, [0.1, 0.3], True
            self.dropout_name, self.hidden_size, self.jitter_noise = "eager", 128, 0.01
            self.drop = torch.nn.Dropout2d(0.5)

    block = Block()
    changed = disable_dropout(block)
    assert (block.drop_path_rate, block.layer_dropouts, block.jitter_noise, block.drop.p) == (0, [0, 0], 0, 0)
    assert (block.use_dropout, block.dropout_name, block.hidden_size) == (True, "eager", 128)  # not rates
    assert sorted(changed) == ["Block.drop_path_rate=0.2", "Block.jitter_noise=0.01", "Block.layer_dropouts=[0.1, 0.3]",
                               "drop.p=0.5"]
    assert disable_dropout(block) == []  # a second pass finds nothing left
