"""Reward functions get TRL's contract (verl_hf/rewards/contract.py): message lists after chat prompts, strings
after text prompts, `trainer_state`, `log_metric` and `log_extra` for functions that take them; the built-ins read
both forms; a function written for the other form is told which it got and why."""

import math

import pytest
import torch

from verl_hf.batch import RolloutBatch, concat_batches
from verl_hf.rewards import completion_text, resolve_reward_funcs, score_completions
from verl_hf.rewards.contract import accepted_extras, reward_completions

CHAT = [[{"role": "user", "content": "2+2?"}]] * 2
TEXT = ["2+2=", "3+3="]


# TRL's documented examples, as its users write them (our own text)
def format_reward_func(completions, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if c.strip().startswith("#### ") else 0.0 for c in contents]


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def score(funcs, prompts, completions, **kwargs):
    funcs = resolve_reward_funcs(funcs)
    return score_completions(funcs, None, prompts=prompts, completions=completions,
                             completion_ids=[[1, 2]] * len(completions), columns={"answer": ["4", "6"]}, **kwargs)


def test_chat_prompts_give_message_lists_and_text_prompts_strings():
    result = score([format_reward_func], CHAT, ["#### 4", "no"])
    assert result.per_function[:, 0].tolist() == [1.0, 0.0]
    seen = {}

    def look(prompts, completions, **kwargs):
        seen["prompts"], seen["completions"] = prompts, completions
        return [0.0] * len(completions)

    score([look], CHAT, ["#### 4", "no"])
    assert seen == {"prompts": CHAT, "completions": [[{"role": "assistant", "content": "#### 4"}],
                                                     [{"role": "assistant", "content": "no"}]]}
    score([look], TEXT, ["#### 4", "no"])
    assert seen["completions"] == ["#### 4", "no"] and seen["prompts"] == TEXT
    assert score([reward_len], TEXT, ["a" * 20, "b"]).per_function[:, 0].tolist() == [0.0, -19.0]


def test_multi_turn_messages_are_the_completion_where_given():
    turns = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
             {"role": "tool", "content": "4"}, {"role": "assistant", "content": "#### 4"}]
    assert reward_completions(CHAT, ["#### 4", "x"], [turns, None]) == [turns, [{"role": "assistant", "content": "x"}]]
    assert completion_text(turns) == "#### 4" and completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                             "text": "b"}]}]) == "ab"


@pytest.mark.parametrize("spec, completions, expected", [
    ("gsm8k", ["#### 4", "#### 5"], [1.0, 0.0]),
    ("exact_match", ["4", "six"], [1.0, 0.0]),
    ("gsm8k_format", ["#### 4", "four"], [1.0, 0.0]),
    (r"regex:^#### \d+$", ["#### 4", "four"], [1.0, 0.0]),
])
def test_builtin_rewards_read_both_forms(spec, completions, expected):
    assert score([spec], CHAT, completions).per_function[:, 0].tolist() == expected
    assert score([spec], TEXT, completions).per_function[:, 0].tolist() == expected


def test_trainer_state_log_metric_and_log_extra_reach_the_functions_that_take_them():
    from transformers import TrainerState

    def shaped(completions, trainer_state, log_metric, log_extra, **kwargs):
        log_metric("shaped/step", float(trainer_state.global_step))
        log_extra("judge_note", [f"n{i}" for i in range(len(completions))])
        return [trainer_state.global_step / 4] * len(completions)

    def plain(prompts, completions, completion_ids, answer):  # written before the extras: still called
        return [1.0] * len(completions)

    state = TrainerState(global_step=3)
    result = score([shaped, plain], CHAT, ["a", "b"], trainer_state=state)
    assert result.per_function.tolist() == [[0.75, 1.0], [0.75, 1.0]]
    assert result.logged_metrics == {"shaped/step": 3.0} and result.metrics()["shaped/step"] == 3.0
    assert result.logged_columns == {"judge_note": ["n0", "n1"]}
    assert accepted_extras(plain, {"trainer_state": 1}) == {}
    assert accepted_extras(lambda completions, log_metric: 0, {"trainer_state": 1, "log_metric": 2}) == {"log_metric": 2}


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_what_logging_gets_wrong_is_named_after_the_call(on_error):
    """Not inside the function: there it would read as the function's failure (scored 0 with on_error='zero')."""
    def short(completions, log_extra, **kwargs):
        log_extra("note", ["only one"])
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'short': log_extra\('note', \.\.\.\) got 1 values for 2 samples"):
        score([short], TEXT, ["a", "b"], on_error=on_error)

    def text_metric(completions, log_metric, **kwargs):
        log_metric("x", "high")
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"log_metric\('x', 'high'\): log a number"):
        score([text_metric], TEXT, ["a", "b"], on_error=on_error)

    def twice(completions, log_extra, **kwargs):
        log_extra("note", ["x", "y"])
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'twice_1': log_extra\('note', \.\.\.\): that column was logged already "
                                         r"\(by 'twice'\)"):
        score([twice, twice], TEXT, ["a", "b"], on_error=on_error)


def test_a_nan_metric_is_left_out_of_the_mean_as_trl_keeps_it():
    def some_nan(completions, log_metric, **kwargs):
        log_metric("judge/agreement", math.nan)
        log_metric("judge/agreement", 0.5)
        return [0.0] * len(completions)

    assert score([some_nan], TEXT, ["a", "b"]).logged_metrics == {"judge/agreement": 0.5}


def test_trainer_state_is_given_only_inside_a_trainer():
    seen = {}

    def look(completions, **kwargs):
        seen.update(kwargs)
        return [0.0] * len(completions)

    score([look], TEXT, ["a", "b"])
    assert "trainer_state" not in seen and {"log_metric", "log_extra", "answer"} <= set(seen)


def test_a_function_that_raised_keeps_nothing_it_logged():
    def flaky(completions, log_metric, **kwargs):
        log_metric("flaky/calls", 1.0)
        if len(completions) > 1:
            raise ValueError("only one at a time")
        return [0.5]

    result = score([flaky], TEXT, ["a", "b"], on_error="zero")
    assert result.per_function[:, 0].tolist() == [0.5, 0.5] and "flaky/calls" not in result.metrics()


def test_a_function_written_for_the_other_form_is_told_what_it_got():
    with pytest.raises(RuntimeError, match=r"'format_reward_func' raised on sample 0 .*TypeError.*completions are "
                                           r"strings because the prompts are text; TRL gives message lists"):
        score([format_reward_func], TEXT, ["#### 4", "no"])

    def strings_only(completions, **kwargs):
        return [float(c.strip() == "4") for c in completions]

    with pytest.raises(RuntimeError, match=r"AttributeError.*completions are message lists .*because the prompts are "
                                           r"chat messages, as in TRL; read completion\[-1\]\['content'\]"):
        score([strings_only], CHAT, ["4", "5"])

    def needs_a_column(completions, solution, **kwargs):  # another mistake: no hint about the form
        return [0.0] * len(completions)

    with pytest.raises(RuntimeError) as error:
        score([needs_a_column], CHAT, ["4", "5"])
    assert "missing 1 required positional argument: 'solution'" in str(error.value)
    assert "message lists" not in str(error.value) and "strings because" not in str(error.value)


def test_a_hub_id_among_reward_functions_points_to_reward_model_path():
    with pytest.raises(ValueError, match=r"looks like a model id: .*reward_model_path='org/reward-model'"):
        resolve_reward_funcs(["org/reward-model"])
    with pytest.raises(ValueError) as error:
        resolve_reward_funcs(["no_such_reward"])
    assert "reward_model_path" not in str(error.value)


def test_batches_join_with_columns_only_some_logged():
    def batch(logged):
        return RolloutBatch(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                            response_ids=torch.zeros(2, 1, dtype=torch.long), response_mask=torch.ones(2, 1),
                            group_ids=torch.tensor([0, 0]), truncated=torch.zeros(2, dtype=torch.bool),
                            prompts=TEXT, completions=["a", "b"], logged_columns=logged)

    joined = concat_batches([batch({"note": ["x", "y"]}), batch({})], pad_token_id=0)
    assert joined.logged_columns == {"note": ["x", "y", None, None]}
    assert joined.select([1, 2]).logged_columns == {"note": ["y", None]}


def test_a_multi_turn_completion_is_every_message_after_the_prompt():
    from verl_hf.agent.loop import Conversation, _completion_messages

    prompt = [{"role": "user", "content": "3*4?"}]
    call = {"role": "assistant", "content": "<tool_call>", "tool_calls": [{"function": {"name": "multiply"}}]}
    answered = [call, {"role": "tool", "content": "12"}, {"role": "assistant", "content": "12"}]
    # the environment's reply after the last turn stays in `messages`: a completion ends with the assistant, as TRL's
    done = Conversation(prompt_ids=[1], messages=[*prompt, *answered, {"role": "user", "content": "correct"}],
                        env=None, prompt=prompt, turns=2)
    assert _completion_messages(done, tokenizer=None) == answered


def test_logged_columns_reach_the_samples_callbacks_rows():
    from callbacks.samples import parquet_schema, sample_rows

    batch = RolloutBatch(prompt_ids=torch.zeros(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1),
                         response_ids=torch.zeros(2, 1, dtype=torch.long), response_mask=torch.ones(2, 1),
                         group_ids=torch.tensor([0, 0]), truncated=torch.zeros(2, dtype=torch.bool), prompts=TEXT,
                         completions=["a", "b"], rewards=torch.tensor([1.0, 0.0]),
                         logged_columns={"judge": ["fine", "off"], "score": [1, 2.5], "reward": ["ours win"],
                                         "detail": [{"k": 1}, None]})
    rows = sample_rows(batch, [], step=3, count=2)
    assert [(r["judge"], r["score"], r["reward"], r["detail"]) for r in rows] == [("fine", 1.0, 1.0, '{"k": 1}'),
                                                                                 ("off", 2.5, 0.0, None)]
    types = {f.name: str(f.type) for f in parquet_schema(rows)}
    assert types["judge"] == "string" and types["score"] == "double"


def test_a_reward_model_among_the_functions_scores_message_lists_as_the_conversation():
    from types import SimpleNamespace

    from verl_hf.roles.reward import RewardModel

    judge = object.__new__(RewardModel)
    judge.tokenizer = SimpleNamespace(chat_template=None)  # rendered as `role: content` lines
    given = reward_completions(CHAT, ["4", "5"])
    assert [judge.format(p, c) for p, c in zip(CHAT, given)] == ["user: 2+2?\nassistant: 4\n",
                                                                 "user: 2+2?\nassistant: 5\n"]
    assert judge.format("2+2=", "4") == "2+2=4"


def test_scores_whose_statistics_overflow_are_named():
    def huge(completions, **kwargs):
        return [3.4e38] * len(completions)

    with pytest.warns(UserWarning, match=r"reward function 'huge' returned scores up to 3.4e\+38: the batch's reward "
                                         r"statistics overflow float32 .* scale the scores down"):
        score([huge, "gsm8k"], TEXT, ["#### 4", "#### 6"])
