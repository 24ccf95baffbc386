"""Turn a safe-rlhf score model (the Beaver reward and cost models, `LlamaForScore` with a `score_head`) into
a plain `LlamaForSequenceClassification` that transformers loads by itself, so that `reward_model_path` and
`cost_model_path` take it like any reward model. The two compute the same number: safe-rlhf's `end_scores`
is the score head on the last non-padding token's hidden state, which is where a sequence-classification
head pools (its pad token must be set and differ from EOS). safe-rlhf scores `prompt + answer + EOS`, so the
converted tokenizer appends EOS itself. tests/test_recipes.py checks the converted model and tokenizer
against safe-rlhf's computation, with right padding.

    python examples/recipes/safe_rlhf/convert_score_model.py PKU-Alignment/beaver-7b-v1.0-reward models/beaver-reward
    python examples/recipes/safe_rlhf/convert_score_model.py PKU-Alignment/beaver-7b-v1.0-cost models/beaver-cost

The source is a Hub id (downloaded with huggingface_hub) or a local folder, with safetensors or
`pytorch_model*.bin` weights. Refused, with the reason: a score head with a bias or more than one output, a
model that normalises its scores (`do_normalize`), a tokenizer without a pad token or with pad == EOS.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def local_folder(source: str) -> Path:
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"]))


def checked_config(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise SystemExit(f"{folder}: model_type {config.get('model_type')!r}; this converter handles Llama score models.")
    if config.get("score_dim", 1) != 1 or config.get("bias", False):
        raise SystemExit(f"{folder}: score head with score_dim={config.get('score_dim')} bias={config.get('bias')}; "
                         f"a sequence-classification head has one output and no bias.")
    if config.get("do_normalize", False):
        raise SystemExit(f"{folder}: do_normalize is on (scores normalised by a running mean/variance); convert "
                         f"only models that score unnormalised, as the Beaver v1.0 models do.")
    return config


def load_weights(folder: Path) -> dict:
    """Every tensor of the checkpoint: safetensors shards, else pytorch_model*.bin shards."""
    import torch
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        for shard in sorted(folder.glob("pytorch_model*.bin")):
            state.update(torch.load(shard, map_location="cpu", weights_only=True))
    if "score_head.weight" not in state:
        raise SystemExit(f"{folder}: no score_head.weight among {len(state)} tensors (*.safetensors or "
                         f"pytorch_model*.bin); is it a safe-rlhf score model?")
    return state


def checked_tokenizer(folder: Path):
    """The score model's tokenizer, appending EOS as safe-rlhf does when it scores; its pad token distinct."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise SystemExit(f"{folder}: the tokenizer's pad token ({tokenizer.pad_token!r}) is missing or equals EOS; "
                         f"the classification head would pool at the wrong token.")
    probe = tokenizer("x")["input_ids"]
    if probe[-1] != tokenizer.eos_token_id:
        bos = tokenizer.bos_token_id is not None and probe[0] == tokenizer.bos_token_id
        single = (f"{tokenizer.bos_token}:0 " if bos else "") + f"$A:0 {tokenizer.eos_token}:0"
        specials = ([(tokenizer.bos_token, tokenizer.bos_token_id)] if bos else []) + [
            (tokenizer.eos_token, tokenizer.eos_token_id)]
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(single=single,
                                                                                   special_tokens=specials)
    return tokenizer


def convert(source: str, out: str) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    folder = local_folder(source)
    config = checked_config(folder)
    tokenizer = checked_tokenizer(folder)
    fields = {k: v for k, v in config.items() if k not in ("architectures", "score_dim", "bias", "score_type",
                                                            "do_normalize", "normalizer_type", "mean", "var")}
    fields["pad_token_id"] = tokenizer.pad_token_id  # where the head stops pooling: the tokenizer's pad
    state = load_weights(folder)
    state["score.weight"] = state.pop("score_head.weight")
    state = {k: v for k, v in state.items() if not k.startswith("normalizer.")}
    with torch.device("meta"):
        model = LlamaForSequenceClassification(LlamaConfig(**fields, num_labels=1))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise SystemExit(f"{folder}: weights do not match a LlamaForSequenceClassification (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}).")
    model.config.score_type = config.get("score_type", "reward")  # kept for the reader: reward or cost
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if AutoTokenizer.from_pretrained(out)("x")["input_ids"][-1] != tokenizer.eos_token_id:
        raise SystemExit(f"{out}: the saved tokenizer does not append EOS after reload ({type(tokenizer).__name__}).")
    print(f"{out}: LlamaForSequenceClassification ({config.get('score_type', 'reward')} model) from {source}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="Hub id or local folder of a safe-rlhf score model")
    parser.add_argument("out", help="where to save the converted model")
    args = parser.parse_args(argv)
    convert(args.source, args.out)


if __name__ == "__main__":
    main()
