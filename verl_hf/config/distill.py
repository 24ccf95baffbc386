"""On-policy distillation: the teacher that scores the student's own samples, and the loss that moves the student
towards it (verl_hf/algorithms/distill.py).

See it work: tests/test_distill_training.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..algorithms import advantage_spec
from .applies import TEACHER, Applies, _help, _multi_turn, one_of, raise_first_failed

DISTILL_LOSSES = ("reverse_kl", "gkd", "topk_forward_kl")
GKD = Applies("distill_loss='gkd'", lambda c, g: c.distill_loss == "gkd", ("distill_loss",))
SERVED = Applies("teacher_server_url is set", lambda c, g: bool(c.teacher_server_url), ("teacher_server_url",))
TOPK = Applies("distill_loss='topk_forward_kl'", lambda c, g: c.distill_loss == "topk_forward_kl", ("distill_loss",))


def _gkd_on_single_turns(cfg, given) -> bool | None:
    """GKD on one-turn rollouts (None while the trainer's tools=/environment= are unknown)."""
    multi_turn = _multi_turn(cfg, given) if cfg.distill_loss == "gkd" else True
    return None if multi_turn is None else not multi_turn


GKD_ONE_TURN = Applies("distill_loss='gkd' on one-turn rollouts (no tools=, environment= or tools)",
                       _gkd_on_single_turns, ("distill_loss", "tools")).because(
    "a dataset answer is one assistant turn; a conversation's environment turns have no dataset counterpart")
# the divergences computed through the student's LM head inside its forward, in chunks
THROUGH_THE_HEAD = ("gkd", "topk_forward_kl")


@dataclass
class DistillFields:
    teacher_model_path: str | None = field(
        default=None,
        metadata=_help("The teacher of on-policy distillation (an id or path), or VerlTrainer(teacher=...) with a "
                       "model or a TeacherPolicy: a frozen causal LM with the student's tokenizer (checked at "
                       "start-up; trailing padding rows may differ) that scores every token the student samples. "
                       "Placed like the KL reference: a whole copy per process, partitioned under ZeRO-3, sharded "
                       "under FSDP2."),
    )
    distill_loss: Annotated[str | None, TEACHER] = field(
        default=None,
        metadata=_help("None: 'reverse_kl' once a teacher is given. 'reverse_kl': each sampled token gets the "
                       "advantage -distill_coef * (log p_student - log p_teacher), added to the task advantages (if "
                       "any reward is given) and trained through the policy loss with its rollout_is corrections; in "
                       "expectation over the student's own samples its gradient is that of the per-token KL(student "
                       "|| teacher) at each sampled prefix, no credit from later tokens (Thinking Machines' on-policy "
                       "distillation, tinker-cookbook's train_on_policy.py, a discount of 0). The "
                       "student's log-probs are the ratio's old ones (one update per round: the live ones, detached; "
                       "no extra forward). 'gkd': GKD's generalized Jensen-Shannon divergence between the student's "
                       "and the teacher's whole next-token distributions at every response position of the student's "
                       "samples (Agarwal et al. 2024), gkd_beta between them, added to the loss times distill_coef "
                       "(token-level, aggregated like the policy loss); computed through both LM heads a chunk of rows "
                       "at a time, so neither model's logits are held whole. 'topk_forward_kl' (a served teacher, "
                       "teacher_server_url): the forward KL on the teacher's distill_topk most likely tokens at every "
                       "response position, sum p_t * (log p_t - log p_s), added to the loss times distill_coef; as "
                       "verl's compute_forward_kl_topk, the top-k mass is not renormalised. With a local teacher, "
                       "'gkd' with gkd_beta=0 is the exact forward KL over the whole vocabulary."),
    )
    teacher_server_url: Annotated[str | None, TEACHER] = field(
        default=None,
        metadata=_help("The teacher served by vLLM (e.g. http://127.0.0.1:8001) instead of a copy placed beside the "
                       "student: `verl-hf vllm-serve TEACHER --max-logprobs K` or any `vllm serve TEACHER "
                       "--max-logprobs K` (no weight transfer needed). The teacher's log-probs are the server's prompt "
                       "log-probs of the student's samples; teacher_model_path still names the teacher (its tokenizer "
                       "and config are checked at start-up, its weights never loaded here). vLLM scores prompt tokens "
                       "at temperature 1, so the run must sample at temperature 1; GKD needs the teacher's hidden "
                       "states and is refused."),
    )
    distill_coef: Annotated[float, TEACHER] = field(
        default=1.0, metadata=_help("Weight of the distillation signal: of the reverse-KL advantage against the task "
                                    "advantages, or of the GKD loss term."),
    )
    teacher_server_timeout_s: Annotated[float, SERVED] = field(
        default=600.0, metadata=_help("Seconds one scoring request to the teacher server (teacher_server_url) may "
                                      "take."),
    )
    distill_topk: Annotated[int, TOPK] = field(
        default=20, metadata=_help("distill_loss='topk_forward_kl': the teacher's most likely tokens per position the "
                                   "forward KL is taken over (the server needs --max-logprobs of at least this; "
                                   "vLLM's default is 20)."),
    )
    gkd_beta: Annotated[float, GKD] = field(
        default=0.5, metadata=_help("GKD's beta: 0 the forward KL(teacher || student), 1 the reverse KL(student || "
                                    "teacher), between them the generalized JSD with the mixture beta * p_teacher + "
                                    "(1 - beta) * p_student (TRL's convention and default)."),
    )
    gkd_lambda: Annotated[float, GKD_ONE_TURN] = field(
        default=1.0, metadata=_help("GKD's lambda, the student-data fraction (Agarwal et al. 2024; TRL's lmbda, 0.5 "
                                    "there): the share of rounds whose answers the student samples. The other "
                                    "rounds take the training dataset's answers, its 'completion' column (a string, "
                                    "or one assistant message as TRL's conversational rows) followed by EOS, each "
                                    "repeated num_generations times to keep the round's shape; such a round trains "
                                    "GKD's divergence alone (not scored, task advantages 0) and logs "
                                    "rollout/dataset_answers. Which rounds is drawn from seed and step: the same on "
                                    "every process and on resume. 1: always the student's own samples. Below 1 "
                                    "every task reward must weigh 0, and kl_coef, rollout_is, PPO's critic and "
                                    "asynchronous training are refused."),
    )


def check_distill(cfg) -> None:
    if cfg.distill_loss is not None:
        one_of("distill_loss", cfg.distill_loss, DISTILL_LOSSES)
    raise_first_failed(cfg, [
        ("distill_coef", cfg.distill_coef > 0, "must be > 0 (the teacher's pull on the student)"),
        ("gkd_beta", 0.0 <= cfg.gkd_beta <= 1.0, "must be in [0, 1] (0: forward KL, 1: reverse KL, between: the JSD)"),
        ("teacher_server_timeout_s", cfg.teacher_server_timeout_s > 0, "must be > 0"),
        ("distill_topk", cfg.distill_topk >= 1, "must be >= 1 (the teacher's tokens per position)"),
        ("gkd_lambda", 0.0 <= cfg.gkd_lambda <= 1.0, "must be in [0, 1] (the share of rounds the student samples)"),
        ("gkd_lambda", cfg.gkd_lambda == 1.0 or cfg.rollout_is is None,
         f"cannot hold with rollout_is={cfg.rollout_is!r}: no engine sampled the dataset's answers, so there are no "
         f"sampling log-probs to correct by. Set rollout_is=None, or gkd_lambda=1"),
        ("gkd_lambda", cfg.gkd_lambda == 1.0 or not advantage_spec(cfg.adv_estimator).needs_values,
         f"cannot hold with adv_estimator={cfg.adv_estimator!r}: the critic would learn values of answers the "
         f"student did not sample. Use a critic-free estimator (grpo), or gkd_lambda=1"),
        ("gkd_lambda", cfg.gkd_lambda == 1.0 or cfg.kl_coef == 0,
         f"cannot hold with kl_coef={cfg.kl_coef}: the KL to the reference would be estimated on answers the "
         f"student did not sample (the teacher anchors the student in GKD). Set kl_coef=0, or gkd_lambda=1"),
        ("distill_loss", cfg.distill_loss not in THROUGH_THE_HEAD or not cfg.training_is_sharded,
         "is not available under DeepSpeed or FSDP yet (under ZeRO-3 and FSDP2 the heads are sharded, and the "
         "chunked divergence reads them whole; ZeRO-1/2 are not tested with it): use one process or DDP, or "
         "distill_loss='reverse_kl'"),
        ("logits_chunk_size", cfg.distill_loss not in THROUGH_THE_HEAD or cfg.logits_chunk_size != 0,
         f"cannot hold with distill_loss={cfg.distill_loss!r}, which goes through the LM head in chunks (0 asks for "
         f"the full logits); leave logits_chunk_size at None or set a chunk size"),
        ("distill_loss", cfg.distill_loss != "topk_forward_kl" or cfg.teacher_server_url,
         "is for a teacher served by vLLM (teacher_server_url), which gives only its top-k; with a local teacher, "
         "distill_loss='gkd' with gkd_beta=0 is the exact forward KL over the whole vocabulary"),
        ("distill_loss", cfg.distill_loss != "gkd" or not cfg.teacher_server_url,
         "reads the teacher's hidden states through its LM head, which a served teacher (teacher_server_url) does "
         "not give: use 'topk_forward_kl' or 'reverse_kl' with it, or a local teacher"),
        ("teacher_server_url", not cfg.teacher_server_url
         or cfg.teacher_server_url.rstrip("/") != (cfg.vllm_server_url or "").rstrip("/"),
         "is also vllm_server_url, the server the student samples from: the teacher would be the student. Serve "
         "the teacher on a server of its own"),
        ("temperature", not cfg.teacher_server_url or cfg.temperature == 1.0,
         "must be 1.0 with a served teacher (teacher_server_url): vLLM's prompt log-probs skip the sampling "
         "processors, so the teacher scores at temperature 1 and the two distributions would not compare; sample at "
         "temperature 1, or place the teacher locally (drop teacher_server_url)"),
    ])
