"""`ServedTeacher`: the distillation teacher on a vLLM server (`teacher_server_url`), for a teacher too large to
place beside the student. It scores the student's samples as prompts: the server's prompt log-probs of each
sampled token, and of its top-k tokens at every response position (`distill_loss='topk_forward_kl'`).

Any vLLM OpenAI server does (`verl-hf vllm-serve TEACHER --max-logprobs K`, or `vllm serve TEACHER --max-logprobs
K`): it needs no weight transfer, only `/v1/completions` with `prompt_logprobs`. Two limits of vLLM set what it
can serve. Prompt log-probs skip the sampling processors, so they are at temperature 1: a run at another
temperature is refused (teacher_setup.check_teacher). And they are normalised over every row of the teacher's
head, so the shared-range scoring of a local teacher with padding rows (Qwen2.5's 152064 vs 151936) is not
available: those rows' share of the mass, if any, stays in the teacher's log-probs, and top-k ids beyond the
shared range are dropped.

See it work: tests/test_rollout_vllm_server.py.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import torch

from ..algorithms.distill import chunked_topk_forward_kl
from ..batch import RolloutBatch
from ..rollout.vllm_server import server_call
from .scoring import divergence_chunk_size, per_position

FIELDS = ("teacher_server_url", "teacher_server_timeout_s")


class ServedTeacher:
    """Holds: the server's URL and the name it serves the teacher under, the ids [0, vocab_size) the student can
    be compared on, the top-k it asks for (0: the sampled tokens only), and the request timeout."""

    temperature = 1.0  # what vLLM's prompt log-probs are at

    def __init__(self, url: str, name: str, vocab_size: int, topk: int = 0, timeout_s: float = 600.0,
                 max_length: int = 0):
        """`max_length`: the longest prompt + response it will be asked to score (checked against the server's)."""
        self.url, self.vocab_size, self.topk, self.timeout_s = url.rstrip("/"), vocab_size, topk, timeout_s
        models = self._call("GET", "/v1/models")["data"]
        # by the name it serves under or the path it loaded: never score with whatever model happens to answer
        found = [m["id"] for m in models if name in (m["id"], m.get("root"))]
        if not found:
            raise ValueError(f"the teacher server at {url} serves {[m['id'] for m in models]}, not "
                             f"teacher_model_path={name!r}: start it on the teacher (`verl-hf vllm-serve {name} "
                             f"--max-logprobs {max(topk, 1)}`), or give the path it serves.")
        self.model_name, self.name = found[0], name
        served_length = next(m.get("max_model_len") for m in models if m["id"] == found[0])
        if served_length is not None and served_length < max_length + 1:  # + the one token each request generates
            raise ValueError(f"the teacher server at {url} has max_model_len={served_length}, but scoring a prompt + "
                             f"response of up to {max_length} tokens needs {max_length + 1}: restart it with "
                             f"--max-model-len {max_length + 1}, or shorten max_prompt_length / max_response_length.")
        self._probe()

    def _call(self, method: str, route: str, body: dict | None = None):
        return server_call(self.url, method, route, body, self.timeout_s, FIELDS)

    def _probe(self) -> None:
        """One two-token request before training: the server returns prompt log-probs of the asked top-k."""
        try:
            self._scored([0, 0])
        except RuntimeError as e:
            raise ValueError(f"the teacher server at {self.url} refused prompt log-probs with top-k {self.topk} "
                             f"({str(e)[-300:]}); restart it with --max-logprobs {max(self.topk, 1)} or lower "
                             f"distill_topk.") from e

    def _scored(self, ids: list[int]) -> list[dict | None]:
        """The server's prompt log-probs of `ids`: per position None (the first) or {id: {"logprob", "rank"}}."""
        body = {"model": self.model_name, "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": self.topk}
        return self._call("POST", "/v1/completions", body)["choices"][0]["prompt_logprobs"]

    @torch.no_grad()
    def get_logprobs(self, sequences: RolloutBatch, micro_batch_size: int | None = None) -> torch.Tensor:
        """The teacher's log-probs (B, Lr) of the sampled response tokens (0 at padding)."""
        return self.score(sequences)[0]

    @torch.no_grad()
    def score(self, sequences: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log-probs (B, Lr) of the sampled tokens, top-k ids (B, Lr, k) and log-probs (B, Lr, k) or None without
        top-k), one request per row, sent together so the server batches them. Missing top-k entries (ids
        beyond the shared range, fewer than k returned) have log-prob -inf and id 0."""
        rows = [_row_ids(sequences, i) for i in range(sequences.response_ids.shape[0])]
        with ThreadPoolExecutor(max(1, min(64, len(rows)))) as pool:
            answers = list(pool.map(lambda row: self._scored(row[0] + row[1]), rows))
        shape = tuple(sequences.response_ids.shape)
        logprobs = torch.zeros(shape)
        ids, top = torch.zeros(*shape, max(self.topk, 1), dtype=torch.long), torch.full((*shape, max(self.topk, 1)),
                                                                                     -math.inf)
        for i, ((prompt, response), answer) in enumerate(zip(rows, answers)):
            for j, token in enumerate(response):
                entries = answer[len(prompt) + j]
                logprobs[i, j] = entries[str(token)]["logprob"]
                # the top-k by rank (vLLM adds the sampled token beyond them); ids past the shared range dropped
                ranked = sorted((e["rank"], int(t), e["logprob"]) for t, e in entries.items()
                                if e["rank"] <= self.topk and int(t) < self.vocab_size)
                for slot, (_, token_id, value) in enumerate(ranked):
                    ids[i, j, slot], top[i, j, slot] = token_id, value
        device = sequences.response_ids.device
        if not self.topk:
            return logprobs.to(device), None, None
        return logprobs.to(device), ids.to(device), top.to(device)

    def topk_divergence(self, sequences: RolloutBatch, chunk_size: int | None = None):
        """The forward KL on the teacher's top-k (scored into `sequences` by `score`), as the function
        `scored_responses(divergence=...)` calls with the student's hidden states (B, K, H) and head: -> (B, K)."""
        if sequences.teacher_topk_ids is None:
            raise RuntimeError("this round carries no top-k from the teacher: it was planned under another "
                               "distill_loss and resumed with distill_loss='topk_forward_kl'. Resume with the "
                               "distill_loss it was saved with, or from a checkpoint between rounds.")
        # the student scores K = Lr + 1 positions (the last predicts nothing): no teacher entry there
        ids = torch.nn.functional.pad(sequences.teacher_topk_ids, (0, 0, 0, 1)).flatten(0, 1)
        top = torch.nn.functional.pad(sequences.teacher_topk_logprobs, (0, 0, 0, 1), value=-math.inf).flatten(0, 1)
        return per_position(lambda hidden, weight, bias: chunked_topk_forward_kl(
            hidden, weight, bias, ids, top, self.temperature, chunk_size or divergence_chunk_size(weight.shape[0]),
            self.vocab_size))


def _row_ids(sequences: RolloutBatch, row: int) -> tuple[list[int], list[int]]:
    """Row `row`'s prompt tokens (without left padding) and response tokens (up to its last real one, tool and
    environment tokens included: they are context the teacher reads)."""
    prompt = sequences.prompt_ids[row][sequences.prompt_mask[row].bool()].tolist()
    length = int(sequences.response_mask[row].nonzero().max()) + 1 if sequences.response_mask[row].any() else 0
    return prompt, sequences.response_ids[row, :length].tolist()
