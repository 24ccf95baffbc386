"""On-policy distillation end to end (VerlTrainer with a teacher): the demo model as student, teachers built from
it. A teacher equal to the student changes nothing (even with padding rows the student lacks), a student that
drifted from its teacher is pulled back, and every bad input is refused before a model loads."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import small_config

WARM_START = str(Path(__file__).resolve().parents[1] / "verl_hf/demo/warm_start")


def _teacher(path: Path, padding_rows: int = 0) -> str:
    """The warm start saved as a teacher, with `padding_rows` trailing embedding rows of large random weights
    (rows no token uses, as Qwen2.5-7B's against 0.5B's)."""
    model = AutoModelForCausalLM.from_pretrained(WARM_START)
    if padding_rows:
        rows = model.config.vocab_size
        model.resize_token_embeddings(rows + padding_rows, mean_resizing=False)
        with torch.no_grad():
            model.get_input_embeddings().weight[rows:] = 10 * torch.randn(padding_rows, model.config.hidden_size,
                                                                          generator=torch.Generator().manual_seed(0))
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(WARM_START).save_pretrained(path)
    return str(path)


def _train(tmp_path, train_dataset, **fields):
    from verl_hf import VerlTrainer

    trainer = VerlTrainer(model=WARM_START, args=small_config(tmp_path, **fields), train_dataset=train_dataset)
    trainer.train()
    return trainer


def test_a_teacher_equal_to_the_student_changes_nothing_even_with_padding_rows(tmp_path, addition):
    """The teacher is the student with 8 padding rows of large weights: scored over its every row its log-probs
    would differ, scored over the rows both share (vocabulary.shared_vocabulary) they are the student's, so the
    reverse-KL advantage is 0 on every token and the run is the plain GRPO run, step for step (the weights held
    still, learning_rate=0, so that the student stays the teacher; the loss and its gradient are still computed)."""
    from verl_hf import TeacherPolicy
    from verl_hf.batch import RolloutBatch

    teacher = _teacher(tmp_path / "teacher", padding_rows=8)
    padded = TeacherPolicy.from_pretrained(teacher)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    batch = RolloutBatch(prompt_ids=ids[:, :3], prompt_mask=torch.ones(1, 3, dtype=torch.long), response_ids=ids[:, 3:],
                         response_mask=torch.ones(1, 3, dtype=torch.long), group_ids=torch.zeros(1, dtype=torch.long),
                         truncated=torch.zeros(1, dtype=torch.bool))
    every_row = padded.get_logprobs(batch)
    padded.vocab_size = 86  # the demo tokenizer's, the student's rows
    assert (every_row - padded.get_logprobs(batch)).abs().max() > 0.1  # the padding rows would matter

    plain = _train(tmp_path / "plain", addition[0], max_steps=2, learning_rate=0.0)
    assert "eval_distill_kl" not in plain.evaluate(addition[1])
    distilled = _train(tmp_path / "distilled", addition[0], max_steps=2, learning_rate=0.0, teacher_model_path=teacher)
    for before, after in zip(plain.state.log_history[:2], distilled.state.log_history[:2]):
        assert after["distill/reverse_kl"] == pytest.approx(0.0, abs=1e-6)
        assert after["loss"] == before["loss"] and after["grad_norm"] == before["grad_norm"]
    assert distilled.teacher.vocab_size == 86
    assert distilled.evaluate(addition[1])["eval_distill_kl"] == pytest.approx(0.0, abs=1e-6)
    distilled.create_model_card()  # the card and verl_config.json record the teacher
    card = (Path(distilled.args.output_dir) / "README.md").read_text()
    assert f"On-policy distillation from the teacher {teacher}: loss reverse_kl, weight 1" in card, card


def _noisy_student(path: Path) -> str:
    """examples/custom_loop_distill.py's drifted student: the warm start with noise in every weight matrix."""
    return _example()["drifted_student"](str(path))


def _example() -> dict:
    import runpy

    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "custom_loop_distill.py"))


def test_reverse_kl_distillation_pulls_a_drifted_student_back_to_its_teacher(tmp_path, addition):
    """The teacher's signal alone (the task reward weighs 0, a metric only): the student is the warm start with
    noise in every weight matrix, the teacher the warm start. The student's KL to the teacher, measured on its own
    samples each step, falls to a fraction within 20 steps (AVX2-only AMD EPYC: 0.38 over the first 5 steps,
    0.09 over the last 5)."""
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, max_steps=20, reward_funcs=["gsm8k"], reward_weights=[0.0],
                        teacher_model_path=WARM_START)
    trainer = VerlTrainer(model=_noisy_student(tmp_path / "student"), args=args, train_dataset=addition[0],
                          eval_dataset=addition[1])
    before = trainer.evaluate()["eval_distill_kl"]  # the exact KL on the held-out greedy answers
    trainer.train()
    kl = [h["distill/reverse_kl"] for h in trainer.state.log_history if "distill/reverse_kl" in h]
    assert len(kl) == 20
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert last < 0.5 * first, kl
    after = trainer.evaluate()["eval_distill_kl"]
    assert after < 0.5 * before, (before, after)


def test_without_a_reward_the_teacher_is_the_only_signal(tmp_path, addition):
    trainer = _train(tmp_path, addition[0], max_steps=1, reward_funcs=None, reward_weights=None,
                     teacher_model_path=_noisy_student(tmp_path / "teacher"))
    logged = trainer.state.log_history[0]
    assert logged["reward/no_task_reward/mean"] == 0.0 and logged["advantages/abs_mean"] == 0.0
    assert logged["distill/reverse_kl"] > 0.1 and logged["grad_norm"] > 0


@pytest.mark.parametrize("fields, given, error, message", [
    (dict(distill_loss="reverse_kl"), {}, ValueError,
     r"distill_loss='reverse_kl' takes effect only when a teacher is given"),
    (dict(distill_coef=0.5), {}, ValueError, r"distill_coef=0.5 takes effect only when a teacher is given"),
    (dict(teacher_model_path="/no/such/teacher"), {}, FileNotFoundError, r"teacher_model_path='/no/such/teacher'"),
    (dict(teacher_model_path=WARM_START), {"teacher": WARM_START}, ValueError, "both name the teacher; give one"),
    (dict(teacher_model_path=WARM_START, reward_funcs=None, reward_weights=[1.0]), {}, ValueError,
     r"reward_weights=\[1.0\] weighs no reward function: a distillation run"),
    (dict(teacher_model_path=WARM_START, dynamic_sampling=True), {}, ValueError,
     "dynamic_sampling=True with a distillation teacher: it drops prompt groups"),
    (dict(teacher_model_path=WARM_START, cost_funcs=["examples/safe_rlhf/task.py:forbidden_digit"], cost_limit=0.05),
     {}, ValueError, "a distillation teacher with Safe-RLHF"),
    (dict(teacher_model_path=WARM_START, distill_loss="topk_forward_kl"), {}, ValueError,
     r"distill_loss='topk_forward_kl' is for a teacher served by vLLM \(teacher_server_url\).* gkd_beta=0"),
    (dict(teacher_model_path=WARM_START, distill_loss="gkd", teacher_server_url="http://127.0.0.1:9"), {}, ValueError,
     r"distill_loss='gkd' reads the teacher's hidden states .* a served teacher"),
    (dict(teacher_model_path=WARM_START, teacher_server_url="http://127.0.0.1:9", temperature=0.7), {}, ValueError,
     r"temperature=0.7 must be 1.0 with a served teacher"),
    (dict(teacher_model_path=WARM_START, distill_loss="gkd", gkd_lambda=0.5), {}, ValueError,
     r"gkd_lambda=0.5 trains some rounds on the dataset's answers, where a task reward.*\(reward_weights=\[0.0, 0.0\]"),
    (dict(teacher_model_path=WARM_START, distill_loss="gkd", gkd_lambda=0.5, reward_weights=[0.0, 0.0]), {},
     ValueError, r"its 'completion' column, which it lacks \(columns: \['prompt', 'answer'"),
    (dict(teacher_model_path=WARM_START, distill_loss="gkd", gkd_lambda=0.5, reward_funcs=None,
          reward_weights=None), {"tools": [lambda x: x]},
     ValueError, r"gkd_lambda=0.5 takes effect only when distill_loss='gkd' on one-turn rollouts"),
    (dict(teacher_model_path=WARM_START, distill_loss="gkd", gkd_lambda=0.5, reward_weights=[0.0, 0.0],
          max_steps=1), {"train_dataset": [{"prompt": "1+1="}]}, TypeError, r"the train dataset is a list"),
    (dict(teacher_server_url="http://127.0.0.1:9"), {}, ValueError,
     r"teacher_server_url='http://127.0.0.1:9' takes effect only when a teacher is given"),
    (dict(teacher_model_path=WARM_START, teacher_server_url="http://127.0.0.1:9"), {}, ConnectionError,
     r"No vLLM server answers at teacher_server_url=http://127.0.0.1:9"),
])
def test_bad_distillation_inputs_are_refused_before_a_model_loads(tmp_path, addition, fields, given, error, message):
    from verl_hf import VerlTrainer

    with pytest.raises(error, match=message):
        VerlTrainer(model=WARM_START, args=small_config(tmp_path, **fields),
                    processing_class=AutoTokenizer.from_pretrained(WARM_START),
                    **{"train_dataset": addition[0], **given})


def test_a_student_with_more_rows_than_its_teacher_is_refused(tmp_path, addition):
    """The student could sample one of its padding ids, which the teacher has no row for (it could not even read
    the response): refused before any model loads, with the fix."""
    from verl_hf import VerlTrainer

    student = _teacher(tmp_path / "student", padding_rows=8)  # 94 rows against the warm start's 86
    with pytest.raises(ValueError, match=r"the student has 94 embedding rows and the teacher .* 86: the student can "
                                         r"sample an id the teacher has no row for"):
        VerlTrainer(model=student, args=small_config(tmp_path, teacher_model_path=WARM_START),
                    train_dataset=addition[0])


def test_a_given_teacher_role_must_score_at_the_run_temperature(tmp_path, addition):
    from verl_hf import TeacherPolicy, VerlTrainer

    role = TeacherPolicy.from_pretrained(WARM_START)  # temperature 1.0; the run samples at 0.7
    with pytest.raises(ValueError, match=r"TeacherPolicy\(\.\.\., temperature=0.7\)"):
        VerlTrainer(model=WARM_START, args=small_config(tmp_path, temperature=0.7), train_dataset=addition[0],
                    teacher=role)


def test_gkd_and_the_held_out_kl_with_a_bf16_teacher_and_an_fp32_student(tmp_path, addition):
    """A teacher checkpoint in bf16 (transformers keeps its dtype) under an fp32 student, no autocast: each side
    through its own head in its own dtype, compared in fp32."""
    from verl_hf import VerlTrainer

    model = AutoModelForCausalLM.from_pretrained(WARM_START).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "teacher")
    AutoTokenizer.from_pretrained(WARM_START).save_pretrained(tmp_path / "teacher")
    args = small_config(tmp_path, max_steps=1, teacher_model_path=str(tmp_path / "teacher"), distill_loss="gkd")
    trainer = VerlTrainer(model=WARM_START, args=args, train_dataset=addition[0], eval_dataset=addition[1])
    assert trainer.teacher.model.dtype == torch.bfloat16 and trainer.model.dtype == torch.float32
    trainer.train()
    kl = trainer.evaluate()["eval_distill_kl"]
    assert 0.0 <= kl < 0.05 and trainer.state.log_history[0]["distill/gkd"] < 0.05  # bf16 rounding only


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_token(tmp_path, addition):
    from verl_hf import VerlTrainer

    teacher = Path(_teacher(tmp_path / "teacher"))
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    tokenizer.add_tokens(["<think>"])  # one more token: the teacher's map is not the student's
    tokenizer.save_pretrained(teacher)
    with pytest.raises(ValueError, match=r"token '<think>' \(id 86\) exists for the teacher .* only.*TRL issue #4562"):
        VerlTrainer(model=WARM_START, args=small_config(tmp_path, teacher_model_path=str(teacher)),
                    train_dataset=addition[0])


@pytest.mark.parametrize("fields, message", [
    (dict(distill_coef=0.0), r"distill_coef=0.0 must be > 0"),
    (dict(distill_loss="gkd", gkd_beta=1.5), r"gkd_beta=1.5 must be in \[0, 1\]"),
    (dict(gkd_beta=0.3), r"gkd_beta=0.3 takes effect only when distill_loss='gkd'"),
    (dict(distill_loss="jsd"), r"distill_loss='jsd' is unknown; valid: gkd, reverse_kl"),
    (dict(distill_loss="gkd", logits_chunk_size=0), r"logits_chunk_size=0 cannot hold with distill_loss='gkd'"),
    (dict(distill_loss="gkd", gkd_lambda=1.5), r"gkd_lambda=1.5 must be in \[0, 1\]"),
    (dict(gkd_lambda=0.5), r"gkd_lambda=0.5 takes effect only when distill_loss='gkd' on one-turn rollouts"),
    (dict(distill_loss="gkd", gkd_lambda=0.5, rollout_is="token"),
     r"gkd_lambda=0.5 cannot hold with rollout_is='token': no engine sampled the dataset's answers"),
    (dict(distill_loss="gkd", gkd_lambda=0.5, adv_estimator="gae"),
     r"gkd_lambda=0.5 cannot hold with adv_estimator='gae'"),
    (dict(distill_loss="gkd", gkd_lambda=0.5, kl_coef=0.01), r"gkd_lambda=0.5 cannot hold with kl_coef=0.01"),
    (dict(distill_loss="gkd", gkd_lambda=0.5, rollout_engine="vllm_server", vllm_server_url="http://127.0.0.1:9",
          max_staleness=1), r"max_staleness=1 cannot run with gkd_lambda=0.5: asynchronous rounds need rollout_is"),
])
def test_distillation_settings_are_checked_when_the_config_is_built(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        small_config(tmp_path, teacher_model_path=WARM_START, **fields)


def test_the_custom_distillation_loop_pulls_its_student_back(tmp_path):
    """examples/custom_loop_distill.py: the roles alone (Actor, TeacherPolicy) and the advantage function, no
    reward. The KL falls as in the trainer (AVX2-only AMD EPYC: 0.36 over the first 5 steps, 0.09 over the last 5)."""
    history, _ = _example()["main"](steps=20)
    assert sum(history[-5:]) / 5 < 0.5 * sum(history[:5]) / 5, history


@pytest.mark.parametrize("tied, temperature, beta", [(True, 1.0, 0.5), (False, 0.7, 0.0), (False, 1.0, 1.0),
                                                     (True, 0.7, 0.3)])
def test_gkd_through_both_heads_in_chunks_equals_the_full_logits_formula(tied, temperature, beta):
    """The student's forward with the divergence against a teacher (a different model with 8 padding rows, whose
    own hidden states come from its own forward) equals GKD's formula on both models' full logits over the shared
    ids: values and the student's gradients within 1e-5, tied and untied heads, with temperature, left padding
    and chunks of 3 rows."""
    from test_scoring import VOCAB, _batch, _llama

    from verl_hf import TeacherPolicy
    from verl_hf.algorithms.distill import generalized_jsd
    from verl_hf.roles.scoring import scored_responses

    student = _llama(tied)
    teacher_model = _llama(not tied)
    teacher_model.resize_token_embeddings(VOCAB + 8, mean_resizing=False)
    with torch.no_grad():
        for p in teacher_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    teacher = TeacherPolicy(teacher_model, temperature=temperature, logits_chunk_size=3, vocab_size=VOCAB)
    batch = _batch()
    weights = torch.linspace(0.5, 1.5, 4).expand(3, 4) * batch.response_mask

    _, _, gkd = scored_responses(student, batch, temperature, chunk_size=3,
                                 divergence=teacher.divergence_against(batch, beta))
    (gkd * weights).sum().backward()
    chunked = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()

    mask, width = batch.attention_mask, batch.response_ids.shape[1]
    inputs = dict(input_ids=batch.input_ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    student_logits = student(**inputs).logits[:, -width - 1:-1, :VOCAB]
    with torch.no_grad():
        teacher_logits = teacher_model(**inputs).logits[:, -width - 1:-1, :VOCAB]
    full = generalized_jsd(student_logits.reshape(-1, VOCAB), teacher_logits.reshape(-1, VOCAB), beta,
                           temperature).view(3, width)
    (full * weights).sum().backward()
    assert torch.allclose(gkd.detach(), full.detach(), atol=1e-5), (gkd - full).abs().max()
    for name, p in student.named_parameters():
        assert torch.allclose(chunked[name], p.grad, atol=1e-5), (name, (chunked[name] - p.grad).abs().max())


def test_gkd_pulls_a_drifted_student_back_to_its_teacher(tmp_path, addition):
    """distill_loss='gkd' (beta 0.5), no task reward: the JSD between the drifted student and the warm start, on
    the student's own samples, falls within 20 steps (AVX2-only AMD EPYC: 0.051 over the first 5 steps, 0.021
    over the last 5, a ratio of 0.42 against the bar of 0.6)."""
    from verl_hf import VerlTrainer

    args = small_config(tmp_path, max_steps=20, reward_funcs=None, reward_weights=None, teacher_model_path=WARM_START,
                        distill_loss="gkd")
    trainer = VerlTrainer(model=_noisy_student(tmp_path / "student"), args=args, train_dataset=addition[0])
    trainer.train()
    jsd = [h["distill/gkd"] for h in trainer.state.log_history if "distill/gkd" in h]
    assert len(jsd) == 20 and "distill/reverse_kl" not in trainer.state.log_history[0]
    assert sum(jsd[-5:]) / 5 < 0.6 * sum(jsd[:5]) / 5, jsd


def test_gkd_lambda_trains_the_drawn_rounds_on_the_datasets_answers(tmp_path):
    """gkd_lambda=0.5 on the demo task with its answers ('completion', '#### <sum>'): the rounds the draw gives
    the dataset (steps 3 and 5 of 6 for seed 0) take its answers, are not scored and have no task advantages,
    the others sample the student (scored, lengths logged); GKD's divergence is trained on both."""
    from verl_hf import VerlTrainer
    from verl_hf.demo.task import demo_splits

    train, _, _ = demo_splits(seed=0, num_train=200, num_test=10, num_dev=10)
    args = small_config(tmp_path, max_steps=6, reward_funcs=None, reward_weights=None, teacher_model_path=WARM_START,
                        distill_loss="gkd", gkd_lambda=0.5)
    trainer = VerlTrainer(model=_noisy_student(tmp_path / "student"), args=args, train_dataset=train)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "distill/gkd" in h]
    assert [h["rollout/dataset_answers"] for h in logged] == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0], logged
    for h in logged:
        assert h["distill/gkd"] > 0 and h["grad_norm"] > 0
        sampled = h["rollout/dataset_answers"] == 0.0
        assert all((name in h) == sampled for name in ("reward/mean", "response_length/mean", "advantages/abs_mean"))
