"""`sequence_logprobs` through the chunked LM head equals the full-logits path (values and gradients) on real
tiny models: tied and untied heads, with temperature and left padding, PEFT, entropy as a metric or in the
loss; it never holds a (B, T, V) tensor for backward; heads it cannot stand in for keep the full path.
The DDP and ZeRO-3 cases run under two processes in test_scoring_distributed.py."""

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from verl_hf.batch import RolloutBatch
from verl_hf.roles.scoring import output_head, sequence_logprobs

VOCAB = 96


def _llama(tied: bool):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                                        tie_word_embeddings=tied))


def _qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=False))


def _batch():
    """Three rows, the first two left-padded, one response token masked (after an EOS)."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, VOCAB, (3, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    response = torch.randint(1, VOCAB, (3, 4), generator=g)
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    return RolloutBatch(prompt_ids=prompt, prompt_mask=prompt_mask, response_ids=response, response_mask=response_mask,
                        group_ids=torch.arange(3), truncated=torch.zeros(3, dtype=torch.bool))


def _scores_and_grads(model, chunk_size, entropy_in_loss: bool, params=None):
    model.zero_grad(set_to_none=True)
    logprobs, entropy = sequence_logprobs(model, _batch(), temperature=0.7, with_entropy=True,
                                          entropy_grad=entropy_in_loss, chunk_size=chunk_size)
    advantages = torch.linspace(-1, 1, logprobs.numel()).view_as(logprobs)
    loss = (advantages * logprobs).sum() - (0.1 * entropy.sum() if entropy_in_loss else 0.0)
    loss.backward()
    named = params or [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return logprobs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in named}


@pytest.mark.parametrize("build", [lambda: _llama(tied=True), lambda: _llama(tied=False), _qwen2],
                         ids=["llama-tied", "llama-untied", "qwen2-untied"])
@pytest.mark.parametrize("entropy_in_loss", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 5, None])  # 15 scored rows: single rows, uneven chunks, one chunk
def test_chunked_head_equals_full_logits(build, entropy_in_loss, chunk_size):
    model = build()
    assert output_head(model) is not None  # the chunked path is the one under test
    full = _scores_and_grads(model, 0, entropy_in_loss)
    chunked = _scores_and_grads(model, chunk_size, entropy_in_loss)
    torch.testing.assert_close(chunked[0], full[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked[1], full[1], atol=1e-5, rtol=1e-5)
    assert full[2].keys() == chunked[2].keys()
    for name in full[2]:
        torch.testing.assert_close(chunked[2][name], full[2][name], atol=1e-5, rtol=1e-5, msg=name)


def test_peft_model_chunked_equals_full_and_adapters_get_the_gradient():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_llama(tied=True), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert output_head(model) is not None
    full, chunked = _scores_and_grads(model, 0, False), _scores_and_grads(model, 3, False)
    torch.testing.assert_close(chunked[0], full[0], atol=1e-5, rtol=1e-5)
    assert full[2] and all("lora_" in name for name in full[2])
    for name in full[2]:
        torch.testing.assert_close(chunked[2][name], full[2][name], atol=1e-5, rtol=1e-5, msg=name)
    with model.disable_adapter(), torch.no_grad():  # the PEFT reference path: adapters off, chunked too
        base = sequence_logprobs(model, _batch(), 0.7, chunk_size=3)[0]
        base_full = sequence_logprobs(model, _batch(), 0.7, chunk_size=0)[0]
    torch.testing.assert_close(base, base_full, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base, chunked[0])  # the adapters really were off


def test_no_vocabulary_sized_tensor_is_kept_for_backward_and_the_head_runs_once():
    model, calls = _llama(tied=True), []
    model.lm_head.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        logprobs, _ = sequence_logprobs(model, _batch(), chunk_size=2)
    assert len(calls) == 1  # one call of the head module per forward, whatever the chunking (ZeRO-3 gathers once)
    assert saved and not any(shape and shape[-1] == VOCAB and len(shape) > 1 and shape[0] > 1 for shape in saved
                             if shape != tuple(model.lm_head.weight.shape)), saved
    logprobs.sum().backward()
    assert model.lm_head.weight.grad is not None


def test_heads_the_chunked_path_cannot_stand_in_for_keep_the_full_logits():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                                           final_logit_softcapping=30.0))
    assert output_head(gemma) is None  # soft-capping happens after the head
    lora_head = get_peft_model(_llama(tied=False), LoraConfig(r=2, target_modules=["lm_head"]))
    assert output_head(lora_head) is None  # the head is a LoRA layer, not a plain Linear
    for model in (gemma, lora_head):  # and both still score (through the full logits)
        logprobs, entropy = sequence_logprobs(model, _batch(), 0.7, with_entropy=True, chunk_size=2)
        assert logprobs.shape == entropy.shape == (3, 4) and torch.isfinite(logprobs).all()


def test_bad_chunk_size_is_refused():
    with pytest.raises(ValueError, match="chunk_size must be >= 0"):
        sequence_logprobs(_llama(tied=True), _batch(), chunk_size=-1)


@pytest.mark.parametrize("chunk_size", [4, None])  # recomputed chunks, and one kept chunk
def test_bf16_autocast_and_bf16_weights_run_and_stay_close_to_fp32(chunk_size):
    """Under CPU bf16 autocast (fp32 master weights) the head's matmuls run in bf16, forward and backward; with
    bf16 weights everything is bf16 but the log-prob arithmetic (fp32). Both stay near the fp32 numbers."""
    model = _llama(tied=True)
    reference = _scores_and_grads(model, 0, entropy_in_loss=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = _scores_and_grads(model, chunk_size, entropy_in_loss=True)
    bf16_model = _llama(tied=True).to(torch.bfloat16)
    bf16 = _scores_and_grads(bf16_model, chunk_size, entropy_in_loss=True)
    for result in (autocast, bf16):
        assert result[0].dtype == torch.float32  # log-probs in fp32 whatever the matmul dtype
        torch.testing.assert_close(result[0], reference[0], atol=0.05, rtol=0.02)
        for name, grad in reference[2].items():
            assert torch.isfinite(result[2][name]).all(), name
            assert result[2][name].dtype == dict(model.named_parameters())[name].dtype or result is bf16
            cos = torch.nn.functional.cosine_similarity(result[2][name].float().flatten(), grad.flatten(), dim=0)
            assert cos > 0.97, (name, float(cos))


def test_a_head_behind_accelerate_hooks_keeps_its_hook_and_the_full_path():
    """device_map / offload put an accelerate hook in the head's forward: the chunked swap would skip it (and
    remove it after), so such a head is scored through the full logits and its hook still runs."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    class Counting(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            Counting.calls += 1
            return args, kwargs

    model = _llama(tied=False)
    add_hook_to_module(model.lm_head, Counting())
    assert output_head(model) is None
    logprobs, _ = sequence_logprobs(model, _batch(), chunk_size=2)
    assert Counting.calls == 1 and "forward" in model.lm_head.__dict__  # the hook ran and is still in place
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert Counting.calls == 2


def test_a_forward_that_bypasses_the_head_module_is_scored_correctly():
    """A custom forward that multiplies by head.weight itself never calls the swapped head: detected (no call
    and logits of vocabulary width came back), and scored through the full logits instead."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    class Bypass(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0, **kwargs):
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                position_ids=position_ids).last_hidden_state
            return CausalLMOutputWithPast(logits=torch.nn.functional.linear(hidden[:, -logits_to_keep:],
                                                                            self.lm_head.weight))

    torch.manual_seed(0)
    model = Bypass(_llama(tied=False).config)
    chunked = sequence_logprobs(model, _batch(), 0.7, chunk_size=2)[0]
    full = sequence_logprobs(model, _batch(), 0.7, chunk_size=0)[0]
    torch.testing.assert_close(chunked, full)
