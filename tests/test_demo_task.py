"""The embedded demo: task, tokenizer, model, and the shipped warm start."""

import os


from verl_hf.demo import WARM_START_DIR, build_char_tokenizer, build_tiny_llama
from verl_hf.demo.task import demo_splits, make_addition_dataset


def test_task_rows_and_disjoint_splits():
    rows = make_addition_dataset(3, seed=0)
    a, b = rows["operands"][0]
    assert rows["prompt"][0] == f"What is {a} plus {b}?\n"
    assert rows["answer"][0] == str(a + b) and rows["completion"][0] == f"#### {a + b}"
    train, dev, test = demo_splits(seed=0, num_train=500, num_test=50, num_dev=50)
    as_set = lambda ds: {tuple(p) for p in ds["operands"]}
    assert not (as_set(train) & as_set(test)) and not (as_set(dev) & as_set(test)) and not (as_set(train) & as_set(dev))


def test_char_tokenizer_round_trips_answers():
    tok = build_char_tokenizer()
    text = "What is 45 plus 67?\n#### 112"
    assert tok.decode(tok(text).input_ids) == text  # the Fuse decoder: no spaces between characters
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"


def test_tiny_model_size_and_head_dim():
    model = build_tiny_llama(build_char_tokenizer())
    assert 400_000 < sum(p.numel() for p in model.parameters()) < 600_000
    assert model.config.head_dim == 64  # vLLM's CPU attention rejects 16


def test_shipped_warm_start_is_small_and_partly_right(policy, tokenizer):
    size = sum(os.path.getsize(WARM_START_DIR / f) for f in os.listdir(WARM_START_DIR))
    assert size < 5 * 1024 * 1024
    from verl_hf.demo.sft import greedy_accuracy

    _, _, test = demo_splits(seed=0)
    accuracy = greedy_accuracy(policy, tokenizer, test)
    assert 0.2 <= accuracy <= 0.45, accuracy  # a warm start: sometimes right, room to learn


def test_sft_script_builds_a_loadable_checkpoint(tmp_path):
    """The script that produced warm_start/ still works (a few steps, not to 30%)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_hf.demo.sft import build_warm_start

    result = build_warm_start(str(tmp_path), target_accuracy=0.0, max_steps=30)
    assert result["steps"] == 25  # stops at the first accuracy check once the target is met
    AutoModelForCausalLM.from_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).decode([10, 11]) == build_char_tokenizer().decode([10, 11])
