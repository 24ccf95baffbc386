"""Tests for verl_hf.rewards: scorers, built-in reward functions, loading
reward functions from strings, and combining scores across functions."""

import math

import numpy as np
import pytest
import torch

from verl_hf.rewards import (
    BUILTIN_REWARDS,
    RewardResult,
    exact_match_reward,
    exact_match_score,
    extract_gsm8k_answer,
    gsm8k_flexible_reward,
    gsm8k_format_reward,
    gsm8k_reward,
    gsm8k_score,
    resolve_reward_funcs,
    score_completions,
)


# ---------------------------------------------------------------- scorers

@pytest.mark.parametrize("text, strict, flexible, lenient, lenient_flexible", [
    ("so the total is 72.\n#### 72", "72", "72", "72", "72"),
    ("#### 1,234", "1234", "1,234", "1234", "1234"),   # verl's flexible keeps the commas
    ("#### $5", None, "5", "5", "5"),                 # verl: no '$' after the marker
    ("#### -3", "-3", "-3", "-3", "-3"),
    ("#### 2.5", "2.5", "2.5", "2.5", "2.5"),
    ("#### 72.", "72.", "72.", "72", "72"),           # verl keeps the full stop (then 72. != 72)
    ("#### 72.0", "72.0", "72.0", "72.0", "72.0"),    # no numeric normalisation
    ("#### 10 then #### 20", "20", "20", "20", "20"),   # last marker wins
    ("#### 10\nchecking: 3 + 4 = 7", "10", "7", "10", "7"),  # flexible: last number
    ("The answer is 42.", None, "42.", None, "42"),
    ("The answer is $1,000.", None, "1,000.", None, "1000"),
    ("####72", None, "72", None, "72"),                 # strict needs the space
    ("#### twelve", None, None, None, None),
    ("no numbers here.", None, None, None, None),
    ("", None, None, None, None),
    ("#### .", ".", None, None, None),                   # verl: '.' after the marker is an (unmatched) answer
    ("#### 7" + " and more" * 40, None, None, "7", "7"),  # verl reads only the last 300 characters
])
def test_extract_gsm8k_answer_every_method(text, strict, flexible, lenient, lenient_flexible):
    assert extract_gsm8k_answer(text, "strict") == strict
    assert extract_gsm8k_answer(text, method="flexible") == flexible
    assert extract_gsm8k_answer(text, method="lenient") == lenient
    assert extract_gsm8k_answer(text, method="lenient_flexible") == lenient_flexible


def test_extract_gsm8k_answer_default_is_strict():
    assert extract_gsm8k_answer("The answer is 42.") is None


def test_extract_gsm8k_answer_rejects_bad_method_and_type():
    with pytest.raises(ValueError, match="method='loose'.*strict"):
        extract_gsm8k_answer("#### 1", method="loose")
    with pytest.raises(TypeError, match="must be a str, got list"):
        extract_gsm8k_answer([1, 2])


@pytest.mark.parametrize("completion, truth, expected", [
    ("#### 72", "72", 1.0),
    ("#### 72", 72, 1.0),
    ("#### 1,234", "1234", 1.0),
    ("#### 1234", "1,234", 1.0),
    ("#### $5", "5", 0.0),      # as verl scores it; method="lenient" reads 5
    ("#### 5.", "5", 0.0),      # as verl scores it; method="lenient" reads 5
    ("#### -7", "-7", 1.0),
    ("#### 7", "-7", 0.0),
    ("#### 72.0", "72", 0.0),
    ("#### 71", "72", 0.0),
    ("the answer is 72", "72", 0.0),
    # ground truth as a full GSM8K solution
    ("#### 72", "She sold 48/2 = 24 clips.\n48+24 = 72\n#### 72", 1.0),
    ("#### 1000", "Total is 1,000.\n#### 1,000", 1.0),
    ("#### 48", "She sold 48 in April.\n#### 72", 0.0),
])
def test_gsm8k_score_strict(completion, truth, expected):
    assert gsm8k_score(completion, truth) == expected


def test_gsm8k_lenient_reads_dollars_and_full_stops():
    assert gsm8k_score("#### $18", "18", method="lenient") == gsm8k_score("#### 18.", "18", method="lenient") == 1.0
    assert BUILTIN_REWARDS["gsm8k_lenient"]([""], ["#### $18"], [[1]], answer=["18"]) == [1.0]
    assert BUILTIN_REWARDS["gsm8k"]([""], ["#### $18"], [[1]], answer=["18"]) == [0.0]


def test_gsm8k_score_format_score_and_score_values():
    kw = dict(format_score=0.1, score=2.0)
    assert gsm8k_score("#### 72", "72", **kw) == 2.0
    assert gsm8k_score("#### 71", "72", **kw) == 0.1  # answer, wrong
    assert gsm8k_score("seventy-two", "72", **kw) == 0.0  # no answer at all


def test_gsm8k_score_flexible():
    assert gsm8k_score("so it is 72", "72", method="flexible") == 1.0
    assert gsm8k_score("so it is 72", "72", method="strict") == 0.0
    assert gsm8k_score("#### 72 wait, 73", "72", method="flexible") == 0.0


def test_gsm8k_score_ground_truth_without_number_raises():
    with pytest.raises(ValueError, match="ground_truth 'n/a' contains no number"):
        gsm8k_score("#### 1", "n/a")


@pytest.mark.parametrize("completion, truth, normalize, expected", [
    ("Paris", "Paris", True, 1.0),
    ("  paris\n", "Paris", True, 1.0),
    ("New   York\tCity", "new york city", True, 1.0),
    ("NewYork", "New York", True, 0.0),
    ("Paris.", "Paris", True, 0.0),
    ("  paris\n", "Paris", False, 0.0),
    ("Paris", "Paris", False, 1.0),
    ("42", 42, True, 1.0),
])
def test_exact_match_score(completion, truth, normalize, expected):
    assert exact_match_score(completion, truth, normalize=normalize) == expected


# ------------------------------------------------------- reward functions

def _call(func, completions, **columns):
    n = len(completions)
    return func([""] * n, completions, [[0]] * n, **columns)


def test_gsm8k_rewards_read_answer_or_ground_truth():
    comps = ["#### 72", "it is 72", "#### 5"]
    truth = ["72", "72", "6"]
    assert _call(gsm8k_reward, comps, answer=truth) == [1.0, 0.0, 0.0]
    assert _call(gsm8k_reward, comps, ground_truth=truth) == [1.0, 0.0, 0.0]
    assert _call(gsm8k_flexible_reward, comps, answer=truth) == [1.0, 1.0, 0.0]
    # `answer` wins over `ground_truth` when both exist
    assert _call(gsm8k_reward, ["#### 1"], answer=["1"],
                 ground_truth=["2"]) == [1.0]


def test_reward_row_without_ground_truth_is_none():
    assert _call(gsm8k_reward, ["#### 1", "#### 2"],
                 answer=["1", None]) == [1.0, None]


def test_gsm8k_format_reward_needs_no_column():
    comps = ["#### 3", "#### x", "answer: 3", "#### -1,000.", "####3"]
    assert _call(gsm8k_format_reward, comps) == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_exact_match_reward():
    assert _call(exact_match_reward, [" Yes ", "no"],
                 ground_truth=["yes", "yes"]) == [1.0, 0.0]


@pytest.mark.parametrize("func", [gsm8k_reward, gsm8k_flexible_reward,
                                  exact_match_reward])
def test_missing_ground_truth_column_raises(func):
    with pytest.raises(ValueError, match=r"only columns \['label', 'question'\]"
                       r".*'answer' or 'ground_truth'.*data_key_map"):
        _call(func, ["#### 1"], question=["q"], label=["1"])


def test_builtin_registry():
    assert {name: BUILTIN_REWARDS[name] for name in ("gsm8k", "gsm8k_flexible", "gsm8k_format", "exact_match")} == {
        "gsm8k": gsm8k_reward, "gsm8k_flexible": gsm8k_flexible_reward,
        "gsm8k_format": gsm8k_format_reward, "exact_match": exact_match_reward}
    assert set(BUILTIN_REWARDS) == {"gsm8k", "gsm8k_flexible", "gsm8k_lenient", "gsm8k_format", "exact_match",
                                    "math_verify", "length", "code"}


# ---------------------------------------------------------------- loading

def my_reward(prompts, completions, completion_ids, **columns):
    return [float(len(c)) for c in completions]


def test_resolve_callables_and_builtins_with_duplicate_suffixes():
    resolved = resolve_reward_funcs([my_reward, "gsm8k", my_reward,
                                     "gsm8k", my_reward])
    assert [name for name, _ in resolved] == [
        "my_reward", "gsm8k", "my_reward_1", "gsm8k_1", "my_reward_2"]
    assert resolved[1][1] is gsm8k_reward
    assert resolved[4][1] is my_reward


def test_resolve_single_spec_and_nameless_callable():
    import functools
    assert resolve_reward_funcs("gsm8k_format") == [
        ("gsm8k_format", gsm8k_format_reward)]
    part = functools.partial(my_reward)
    assert resolve_reward_funcs([part]) == [("partial", part)]


def test_resolve_module_colon_function(tmp_path, monkeypatch):
    pkg = tmp_path / "my_reward_pkg_xyz"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rw.py").write_text(
        "def shout(prompts, completions, completion_ids, **kw):\n"
        "    return [1.0 if c.isupper() else 0.0 for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    [(name, func)] = resolve_reward_funcs(["my_reward_pkg_xyz.rw:shout"])
    assert name == "shout"
    assert _call(func, ["HI", "hi"]) == [1.0, 0.0]


def test_resolve_file_colon_function(tmp_path):
    path = tmp_path / "custom_rewards.py"
    path.write_text(
        "def length(prompts, completions, completion_ids, **kw):\n"
        "    return [float(len(ids)) for ids in completion_ids]\n")
    [(name, func)] = resolve_reward_funcs([f"{path}:length"])
    assert name == "length"
    assert func([""], ["abc"], [[1, 2, 3]]) == [3.0]


def test_resolve_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown reward function 'gsm9k'.*"
                       r"exact_match, gsm8k.*'pkg.module:function'.*"
                       r"'path/to/file.py:function'"):
        resolve_reward_funcs(["gsm9k"])
    with pytest.raises(ValueError, match="unknown reward function 3"):
        resolve_reward_funcs([3])
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod_q'"):
        resolve_reward_funcs(["no_such_mod_q:f"])
    with pytest.raises(ValueError, match="'math' has no callable named 'nope'"):
        resolve_reward_funcs(["math:nope"])
    with pytest.raises(ValueError, match="has no callable named 'pi'"):
        resolve_reward_funcs(["math:pi"])  # exists but is a float
    missing = tmp_path / "missing.py"
    with pytest.raises(ValueError, match="file .*missing.py' does not exist"):
        resolve_reward_funcs([f"{missing}:f"])
    with pytest.raises(ValueError, match="got no reward functions"):
        resolve_reward_funcs([])


# -------------------------------------------------------------- combining

def _const(values, name="f"):
    def f(prompts, completions, completion_ids, **columns):
        return values
    f.__name__ = name
    return (name, f)


def _score(funcs, weights=None, n=None, columns=None):
    n = n if n is not None else len(funcs[0][1](None, None, None))
    return score_completions(
        funcs, weights, prompts=["p"] * n, completions=["c"] * n,
        completion_ids=[[1]] * n, columns=columns or {})


def test_score_completions_passes_keywords_and_columns_once():
    calls = []

    def spy(*, prompts, completions, completion_ids, answer):
        calls.append((prompts, completions, completion_ids, answer))
        return [1.0, 0.0]

    result = score_completions(
        [("spy", spy)], None, prompts=["p0", "p1"], completions=["a", "b"],
        completion_ids=[[1], [2, 3]], columns={"answer": ["x", "y"]})
    assert calls == [(["p0", "p1"], ["a", "b"], [[1], [2, 3]], ["x", "y"])]
    assert result.rewards.tolist() == [1.0, 0.0]


def test_none_excludes_sample_per_function_with_weights():
    f = _const([1.0, None, 0.5, None], "f")
    g = _const([2.0, 3.0, None, None], "g")
    result = _score([f, g], weights=[0.5, 2.0])
    # s0: 0.5*1.0 + 2.0*2.0 = 4.5   (both scored)
    # s1: 2.0*3.0           = 6.0   (f gave None: only g counts, not 0)
    # s2: 0.5*0.5           = 0.25  (only f)
    # s3: nobody scored     -> NaN, invalid
    assert isinstance(result, RewardResult)
    assert result.rewards.dtype == torch.float32
    assert result.rewards[:3].tolist() == [4.5, 6.0, 0.25]
    assert math.isnan(result.rewards[3].item())
    assert result.valid.tolist() == [True, True, True, False]
    assert result.per_function.shape == (4, 2)
    assert torch.isnan(result.per_function).tolist() == [
        [False, False], [True, False], [False, True], [True, True]]
    assert result.names == ["f", "g"]


def test_metrics_over_valid_and_per_function_scores():
    f = _const([1.0, None, 3.0, None], "f")
    g = _const([None, None, None, None], "g")
    h = _const([1.0, 5.0, None, None], "h")
    m = _score([f, g, h]).metrics()
    # rewards: s0 = 1+1 = 2, s1 = 5, s2 = 3, s3 = NaN (invalid)
    # mean = 10/3; population var = ((2-10/3)^2 + (5-10/3)^2 + (3-10/3)^2)/3
    var = ((2 - 10 / 3) ** 2 + (5 - 10 / 3) ** 2 + (3 - 10 / 3) ** 2) / 3
    assert m["reward/mean"] == pytest.approx(10 / 3)
    assert m["reward/std"] == pytest.approx(math.sqrt(var))
    assert m["reward/f/mean"] == pytest.approx(2.0)
    assert m["reward/h/mean"] == pytest.approx(3.0)
    assert "reward/g/mean" not in m  # no scores -> skipped, not NaN
    assert all(math.isfinite(v) for v in m.values())


def test_accepts_tuple_tensor_ndarray_and_bool():
    outs = [(1, 0), torch.tensor([0.5, 1.5]), np.array([2.0, 3.0]),
            [True, False], [np.float32(1.0), torch.tensor(2.0)]]
    result = _score([_const(o, f"f{i}") for i, o in enumerate(outs)])
    assert result.per_function.tolist() == [
        [1.0, 0.5, 2.0, 1.0, 1.0], [0.0, 1.5, 3.0, 0.0, 2.0]]
    assert result.rewards.tolist() == [5.5, 6.5]


def test_default_weights_are_one():
    result = _score([_const([1.0], "a"), _const([2.0], "b")])
    assert result.rewards.tolist() == [3.0]


@pytest.mark.parametrize("output, error, message", [
    ([1.0, 2.0, 3.0], ValueError,
     "reward function 'f' returned 3 scores for 4 completions"),
    ("1234", TypeError, "reward function 'f' returned str"),
    (None, TypeError, "reward function 'f' returned NoneType"),
    (1.0, TypeError, "reward function 'f' returned float"),
    (torch.ones(4, 1), ValueError, r"returned a 2-D Tensor of shape \(4, 1\)"),
    (np.ones((2, 2)), ValueError,
     "returned a 2-D ndarray"),
    ([1.0, "good", 0.0, 0.0], TypeError,
     r"returned 'good' \(str\) for sample 1"),
    ([1.0, 0.0, [1.0], 0.0], TypeError, r"returned \[1.0\] \(list\) for sample 2"),
    ([1.0, 0.0, 0.0, float("nan")], ValueError,
     r"returned nan for sample 3.*return None \(not NaN\)"),
    ([float("inf"), 0.0, 0.0, 0.0], ValueError, "returned inf for sample 0"),
    (torch.tensor([0.0, float("nan"), 0.0, 0.0]), ValueError,
     "returned nan for sample 1"),
])
def test_bad_outputs_raise_naming_function(output, error, message):
    with pytest.raises(error, match=message):
        _score([_const(output, "f")], n=4)


def test_a_score_beyond_float32_is_refused_not_logged_as_inf():
    with pytest.raises(ValueError, match=r"reward function 'a' returned 1e\+39 for sample 0, beyond float32's range"):
        _score([_const([1e39], "a")])


def test_weights_length_must_match():
    with pytest.raises(ValueError, match=r"reward_weights has 1 entries \[1.0\] for 2 "
                       r"reward functions \['a', 'b'\]; give one weight per function"):
        _score([_const([1.0], "a"), _const([1.0], "b")], weights=[1.0])


def test_all_none_raises():
    f = _const([None, None, None], "f")
    g = _const([None, None, None], "g")
    with pytest.raises(ValueError, match="every reward function returned None "
                       r"for all 3 samples of this batch.*fallback"):
        _score([f, g])


def test_input_alignment_errors():
    f = _const([1.0, 1.0], "f")
    with pytest.raises(ValueError, match="'answer' has 1 entries for 2 "
                       "completions"):
        _score([f], columns={"answer": ["x"]})
    with pytest.raises(ValueError, match="'prompts' has 1 entries"):
        score_completions([f], None, prompts=["p"], completions=["a", "b"],
                          completion_ids=[[1], [2]], columns={})
    with pytest.raises(ValueError, match="column 'completions' clashes"):
        _score([f], columns={"completions": ["x", "y"]})
    with pytest.raises(TypeError, match="'answer' is a int, not a list"):
        _score([f], columns={"answer": 3})
    with pytest.raises(ValueError, match="reward_funcs is empty"):
        _score([], n=2)
    with pytest.raises(ValueError, match="got 0 completions"):
        _score([f], n=0)


def test_exception_inside_function_names_function_and_sample():
    def boom(**kw):
        raise KeyError("answer")
    with pytest.raises(RuntimeError, match="reward function 'boom' raised on sample 0 of 1") as info:
        _score([("boom", boom)], n=1)
    assert isinstance(info.value.__cause__, KeyError)


def test_builtins_end_to_end_through_resolve():
    funcs = resolve_reward_funcs(["gsm8k", "gsm8k_format"])
    result = score_completions(
        funcs, [1.0, 0.2], prompts=["q1", "q2", "q3"],
        completions=["#### 72", "#### 5", "72"], completion_ids=[[1]] * 3,
        columns={"answer": ["Work...\n#### 72", "6", "72"]})
    # correct+format: 1.0 + 0.2; wrong+format: 0 + 0.2; no marker: 0 + 0
    assert result.rewards.tolist() == pytest.approx([1.2, 0.2, 0.0])


def test_overlong_penalty_hand_example():
    import torch

    from verl_hf.rewards.shaping import overlong_penalty

    # L_max 10, buffer 4 -> free up to 6; lengths 5, 6, 8, 10 -> 0, 0, -2/4, -4/4 (factor 1)
    out = overlong_penalty(torch.tensor([5, 6, 8, 10]), max_response_length=10, buffer_len=4)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(torch.tensor([10]), 10, 0).tolist() == [0.0]  # off


@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>\nAdd them.\n</think>\n\nThe answer is 5.", "Add them.", "The answer is 5."),  # Qwen3, QwQ
    ("Add them.\n</think>\n\nThe answer is 5.", "Add them.", "The answer is 5."),  # R1-style: <think> in the prompt
    ("<think>\n\n</think>\n\nThe answer is 5.", "", "The answer is 5."),  # enable_thinking=False's empty block
    ("<think>\nAdd them, then", "Add them, then", ""),  # cut off while thinking: no answer yet
    ("The answer is 5.", "", "The answer is 5."),  # no thinking
    ("<think>a</think>b</think>c", "a", "c"),  # as Qwen3's template: before the first, after the last
    ("The <think> tag opens thinking.", "", "The <think> tag opens thinking."),  # only an opening <think> opens it
])
def test_split_think_by_hand(text, reasoning, content):
    from verl_hf.rewards.reasoning import split_think

    assert split_think(text) == (reasoning, content)


def test_split_think_when_the_prompt_opened_the_block():
    """DeepSeek-R1 / QwQ: '<think>\n' ends the prompt, so a completion cut off before </think> is all thinking."""
    from verl_hf.rewards.reasoning import reasoning_columns, split_think

    assert split_think("Add them, then", opened_in_prompt=True) == ("Add them, then", "")
    assert split_think("Add them, then", opened_in_prompt=False) == ("", "Add them, then")
    assert reasoning_columns(["Add them.\n</think>\n\n5.", "Add"], "deepseek_r1") == {
        "reasoning": ["Add them.", "Add"], "contents": ["5.", ""]}


def test_reward_functions_get_the_reasoning_and_the_content_apart_only_when_asked():
    """The reward stage gives `reasoning` and `contents` with reasoning_format='think' (completions stay whole)
    and neither without it; so do Safe-RLHF's cost functions."""
    from verl_hf.batch import RolloutBatch
    from verl_hf.sample_and_score import RewardSettings, RewardStage

    seen = []

    def judge(prompts, completions, completion_ids, **columns):
        seen.append((list(completions), columns.get("reasoning"), columns.get("contents")))
        return [float(c.endswith("5.")) for c in columns.get("contents", completions)]

    texts = ["<think>\nMaybe 4.\n</think>\n\nThe answer is 5.", "<think>\nIt is 5.\n</think>\n\nThe answer is 4."]
    ids = torch.ones(2, 3, dtype=torch.long)
    batch = RolloutBatch(prompt_ids=ids, prompt_mask=ids, response_ids=ids, response_mask=ids,
                         group_ids=torch.zeros(2, dtype=torch.long), truncated=torch.zeros(2, dtype=torch.bool),
                         prompts=["q", "q"], completions=texts, columns={"answer": ["5", "5"]})
    settings = dict(reward_on_error="raise", reward_timeout_s=None, max_response_length=8, overlong_buffer_len=0,
                    overlong_penalty_factor=1.0)
    result = RewardStage([("judge", judge)], [1.0], RewardSettings(**settings, reasoning_format="think")).run(batch)
    assert seen[-1] == (texts, ["Maybe 4.", "It is 5."], ["The answer is 5.", "The answer is 4."])
    assert result.rewards.tolist() == [1.0, 0.0]
    RewardStage([("judge", judge)], [1.0], RewardSettings(**settings, reasoning_format=None)).run(batch)
    assert seen[-1] == (texts, None, None)
    from verl_hf.safety import SafetyConstraint, SafetySettings

    safety = SafetySettings(cost_limit=0.1, lambda_init=1.0, lambda_lr=0.1, lambda_max=None,
                            lambda_update_delay_steps=0, episode_cost_window_size=8, safety_filter_threshold=None,
                            reward_timeout_s=None, world_size=1, reasoning_format="think")
    assert SafetyConstraint([("judge", judge)], safety, None).eval_costs(batch) == [1.0, 0.0]  # costs too
    assert seen[-1] == (texts, ["Maybe 4.", "It is 5."], ["The answer is 5.", "The answer is 4."])


def test_reasoning_format_is_checked_and_its_columns_cannot_be_the_datasets(tmp_path):
    from datasets import Dataset

    from verl_hf import VerlConfig
    from verl_hf.data import prepare_datasets

    with pytest.raises(ValueError, match=r"reasoning_format='xml' is unknown; valid: deepseek_r1, think"):
        VerlConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", reasoning_format="xml")
    args = VerlConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", reasoning_format="think")
    rows = Dataset.from_dict({"prompt": ["1+1?"], "reasoning": ["the dataset's own"]})
    with pytest.raises(ValueError, match=r"train: the run gives reward functions the columns 'reasoning' \(each "
                                         r"completion's thinking\), 'contents' .*the dataset has \['reasoning'\] "
                                         r"already. Rename them"):
        prepare_datasets(rows, None, None, args)
