"""The pieces of the vLLM workarounds that run without vLLM: HF classes restored after an in-place decoration,
bucket names to decoder-layer prefixes, and transformers 5's in-memory layout reverted to the checkpoint's
(what vLLM's loaders read) for a Qwen3-MoE, whose experts are fused in memory and per-expert on disk."""

import torch

from verl_hf.rollout.vllm_compat import layer_prefixes, transformers_classes_kept
from verl_hf.rollout.vllm_compat import checkpoint_form


def tiny_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=3,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16))


def test_classes_decorated_in_place_are_restored():
    """What vLLM's Transformers backend does to the decoder class (a new base, __init__ and __call__, a flag)
    is undone on exit, and a model built before keeps working."""
    model = tiny_moe()
    decoder = type(model.model)
    bases, init = decoder.__bases__, decoder.__init__

    class Wrapper:
        def __call__(self, *args, **kwargs):
            return self.do_not_compile  # what vLLM's decorated __call__ reads; the training model lacks it

    with transformers_classes_kept(model):
        decoder.__bases__ = decoder.__bases__ + (Wrapper,)
        decoder.__init__ = lambda self, *a, **k: (_ for _ in ()).throw(AssertionError("outside vLLM's context"))
        decoder.__call__ = Wrapper.__call__
        decoder.ignore_compile = False
    assert decoder.__bases__ == bases and decoder.__init__ is init
    assert "__call__" not in vars(decoder) and not hasattr(decoder, "ignore_compile")
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 64)
    type(model)(model.config)  # and a new one can be built


def test_layer_prefixes_of_a_bucket():
    names = ["model.layers.0.mlp.experts.0.up_proj.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.12.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"]
    assert layer_prefixes(names) == ["model.layers.0", "model.layers.12"]


def test_checkpoint_form_is_what_save_pretrained_writes(tmp_path):
    from safetensors.torch import load_file

    model = tiny_moe()
    model.save_pretrained(tmp_path)
    on_disk = load_file(tmp_path / "model.safetensors")
    in_memory = dict(model.named_parameters())
    assert "model.layers.0.mlp.experts.gate_up_proj" in in_memory  # fused in memory
    layer0 = [(n, p.detach()) for n, p in in_memory.items() if n.startswith("model.layers.0.")]
    converted = dict(checkpoint_form(model, layer0))
    expected = {n: t for n, t in on_disk.items() if n.startswith("model.layers.0.")}
    assert converted.keys() == expected.keys() and "model.layers.0.mlp.experts.2.down_proj.weight" in converted
    assert all(torch.equal(converted[n], expected[n]) for n in expected)
    # a dense model's names and tensors pass through unchanged
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16))
    named = [(n, p.detach()) for n, p in dense.named_parameters()]
    assert {n: t.data_ptr() for n, t in checkpoint_form(dense, named)} == {n: t.data_ptr() for n, t in named}


def test_tied_copies_are_skipped_only_where_the_engine_ties_them_itself():
    from verl_hf.rollout.vllm_compat import tied_copies_engine_has

    tied = {"model.embed_tokens.weight": "lm_head.weight"}
    llama = {"model.embed_tokens.weight", "lm_head.weight"}  # vLLM's Llama: a head its reload does not re-tie
    gemma = {"model.embed_tokens.weight"}                    # vLLM's Gemma-2: no head at all
    assert tied_copies_engine_has(tied, llama) == tied
    assert tied_copies_engine_has(tied, gemma) == {}
    # names the engine does not know on either side: kept, so that the sync names the mismatch loudly
    assert tied_copies_engine_has(tied, {"transformer.wte.weight"}) == tied


def test_expert_weights_that_repacked_nothing_are_an_error():
    import pytest

    from verl_hf.rollout.vllm_compat import check_repacked

    names = ["model.layers.3.mlp.experts.0.up_proj.weight", "model.layers.3.input_layernorm.weight"]
    check_repacked(names, ["model.layers.3.mlp.experts.routed_experts"], on_cpu=True)
    check_repacked(names, [], on_cpu=False)  # GPU kernels convert on every reload themselves
    check_repacked(["model.layers.3.self_attn.q_proj.weight"], [], on_cpu=True)  # a dense bucket
    with pytest.raises(RuntimeError, match=r"no CPU expert kernel under \['model.layers.3'\] was repacked"):
        check_repacked(names, [], on_cpu=True)


def test_a_decoration_in_compiled_mode_is_refused_and_still_undone():
    import pytest

    model = tiny_moe()
    decoder = type(model.model)
    with pytest.raises(ValueError, match="needs vLLM's eager mode"):
        with transformers_classes_kept(model, eager=False):
            decoder.ignore_compile = False
    assert not hasattr(decoder, "ignore_compile")
    with transformers_classes_kept(model, eager=False):  # nothing changed: nothing to refuse
        pass


def test_routes_capture_passes_vllms_own_aux_output_check_with_prefix_caching_on():
    """vLLM refuses enable_return_routed_experts without prefix caching ("AuxOutput Connector requires prefix
    caching", 0.32-0.34): our engine's settings pass vLLM's own check (run on a config of the shape it reads),
    which the old settings (prefix caching off) failed. Capturing itself needs a GPU (Model Runner V2, Triton)."""
    from types import SimpleNamespace

    import pytest

    vllm_config = pytest.importorskip("vllm.config.vllm")
    from verl_hf.rollout.vllm_engine import _llm_kwargs

    kwargs = _llm_kwargs("dir", torch.float32, 0, 64, 1, True, 0.3, None, False, 0, return_routes=True)
    assert kwargs["enable_return_routed_experts"] is True

    def checked(prefix_caching: bool) -> None:
        config = SimpleNamespace(aux_output_config=SimpleNamespace(enabled=True), use_v2_model_runner=True,
                                 model_config=SimpleNamespace(runner_type="generate", is_moe=True),
                                 cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
                                 speculative_config=None, parallel_config=SimpleNamespace(pipeline_parallel_size=1))
        try:
            vllm_config.VllmConfig._verify_aux_output_compatibility(config)
        except AttributeError:  # checks past the ones this config's shape covers
            pass

    checked(kwargs["enable_prefix_caching"])
    with pytest.raises(ValueError, match="requires prefix caching"):
        checked(False)
