"""Built-in verifying rewards: math-verify, regex format, length, code against tests (in the sandbox)."""

import pytest

from verl_hf.rewards import resolve_reward_funcs, score_completions


def _call(spec, completions, **columns):
    (name, func), = resolve_reward_funcs([spec])
    ids = [[0] * len(c) for c in completions]
    return name, func(prompts=["q"] * len(completions), completions=completions, completion_ids=ids, **columns)


def test_math_verify_compares_values_not_strings():
    name, scores = _call("math_verify", ["so \\boxed{\\frac{2}{4}}", "The answer is $0.5$", "#### 42", "it is 41",
                                         "no idea"], answer=["\\frac{1}{2}", "1/2", "42", "42", "3"])
    assert name == "math_verify" and scores == [1.0, 1.0, 1.0, 0.0, 0.0]
    _, missing = _call("math_verify", ["\\boxed{1}"], ground_truth=[None])
    assert missing == [None]


def test_math_verify_scores_off_the_main_thread():
    """The asynchronous producer scores in its own thread, where math-verify's signal.alarm limits raise
    ValueError ("doesn't support threaded environment"): there the reward runs without them (reward_timeout_s
    still bounds the call), with the same scores."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        _, scores = pool.submit(_call, "math_verify", ["so \\boxed{\\frac{2}{4}}", "it is 41"],
                                answer=["\\frac{1}{2}", "42"]).result()
    assert scores == [1.0, 0.0]


def test_regex_format_reward():
    name, scores = _call("regex:^<think>.*</think>\\s*<answer>.*</answer>$",
                         ["<think>a\nb</think> <answer>3</answer>", "<answer>3</answer>"])
    assert name == "regex" and scores == [1.0, 0.0]
    with pytest.raises(ValueError, match="invalid regular expression"):
        resolve_reward_funcs(["regex:(unclosed"])


def test_length_reward_counts_tokens():
    assert _call("length", ["abc", ""])[1] == [3.0, 0.0]


def test_code_reward_runs_completions_against_tests():
    completions = ["Here:\n```python\ndef add(a, b):\n    return a + b\n```",
                   "```python\ndef add(a, b):\n    return a - b\n```",
                   "```python\ndef add(a, b):\n    while True:\n        pass\n```",
                   "def add(a, b): return a + b",
                   "```python\nimport os\nos.system('true')\ndef add(a, b): return a + b\n```"]
    tests = ["assert add(2, 3) == 5"] * 3 + [["assert add(1, 1) == 2", "assert add(0, 0) == 0"], "assert add(1, 2) == 3"]
    name, scores = _call("code", completions, tests=tests)
    assert name == "code" and scores == [1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="needs a column 'tests'"):
        _call("code", ["x"], answer=["1"])


def test_verifiers_combine_with_weights():
    funcs = resolve_reward_funcs(["math_verify", "regex:\\\\boxed"])
    result = score_completions(funcs, [1.0, 0.1], prompts=["q", "q"], completions=["\\boxed{4}", "4"],
                               completion_ids=[[1], [1]], columns={"answer": ["4", "5"]})
    assert result.rewards.tolist() == pytest.approx([1.1, 0.0])
