"""The multi-turn rollout loop: one loop over any rollout engine, for `tools=` and `environment=` alike.

Each sample is a conversation. A turn: every unfinished sample's whole sequence so far (its prompt ids, then
everything after) goes to the engine as a prompt, and the ids it samples are kept as they are (token in,
token out). Then every sample's environment answers at once (tools and async environments run concurrently
on the event loop the rewards use), and the answering messages' ids are appended (chat.py). On an engine
that serves requests concurrently (the vLLM server, and colocated vLLM without tensor parallelism, which
steps its engine for the requests as they come) each sample plays on its own instead: its turn is a request
of its own, so no sample waits for another's tools (continuous batching across turns). A sample ends when
its environment says so (for tools: a turn without a tool call), after `max_turns` turns, when its
total of `max_tokens` (model and environment tokens together) would be passed, or when a turn reaches the
sampling's `max_new_tokens` without ending.

Images (a vision-language policy, MultiTurnRollout given its processor): a conversation keeps its pixel inputs
(`vision.RowPixels`), its prompt's and then those of every image an environment or tool answers with, in the order
their placeholders appear in its ids; each answer's placeholders are expanded to its images' tokens as the
processor expands them, every turn goes to the engine with all the conversation's images so far, and a turn that
samples an image placeholder is cut before it (stop "image_token"). A reply that would bring a sample past
the engine's `max_images_per_prompt` ends it ("max_images"); one whose images cannot be shown (a placeholder
without its image, an image the processor cannot take) ends it with a warning ("image_error"). vision/answers.py
makes an answer's ids and pixels; that the chat template shows an answer's image is checked at construction.

`to_batch` makes the round's RolloutBatch: `response_mask` is 1 on the model's tokens only, `env_mask` 1 on
the environment's (attended, never trained on), sampling log-probs exist for the model's tokens, and an
environment's per-turn rewards sit on the last token of their turn (`turn_rewards`).

See it work: tests/test_agent_loop.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from ..batch import RolloutBatch, row_columns
from ..data import tokenize_prompt
from ..rewards.calling import RewardTimeout, run_coroutines
from ..rollout.base import SamplingConfig, left_pad
from ..vision.answers import AnswerImageError, AnswerImages
from ..vision.images import message_images
from ..vision.inputs import extend_row
from ..vision.setup import is_processor, share_chat_template
from .chat import ChatTemplateError, continuation_text, with_calls
from .environment import Step, call_id, template_calls
from .tools import ToolCall, call_anyhow

logger = logging.getLogger(__name__)
STOP_REASONS = ("done", "max_turns", "budget", "length", "other_stop", "template", "image_token", "max_images",
                "image_error")
TRUNCATED = ("budget", "length", "max_turns", "image_token", "max_images")  # the stops that cut a sample short


@dataclass
class Conversation:
    """One sample: its prompt ids and messages, its environment, and everything after the prompt so far."""

    prompt_ids: list[int]
    messages: list[dict]
    env: object
    ids: list[int] = field(default_factory=list)  # model and environment tokens, in order
    from_model: list[int] = field(default_factory=list)  # 1: sampled by the model, 0: the environment's
    logprobs: list[float] = field(default_factory=list)  # sampling log-probs (0.0 on environment tokens)
    rewards: dict[int, float] = field(default_factory=dict)  # position in ids -> that turn's reward
    statuses: list[str] = field(default_factory=list)  # every tool call's outcome (tools.STATUSES)
    turns: int = 0
    stop: str | None = None  # one of STOP_REASONS once finished
    last_turn: list[int] = field(default_factory=list)
    prompt: list[dict] = field(default_factory=list)  # the opening messages (the row's prompt, or reset()'s)
    index: int = 0  # its place in the round's batch (errors name it)
    pixels: object = None  # vision.RowPixels of every image in prompt_ids + ids so far, or None
    max_images: int | None = None  # the most images the engine takes in one prompt (None: no limit)


class MultiTurnRollout:
    """Holds: the environment factory, the tokenizer (and a vision-language policy's processor), the tools'
    schemas (for the chat template), and the limits: `max_turns`, `max_tokens` per sample (model and environment
    tokens), `turn_length` per turn, `env_timeout_s` per answer, `max_prompt_tokens` for the messages an
    environment's reset() opens with."""

    def __init__(self, make_env, tokenizer, tools_schema: list[dict] | None, max_turns: int, max_tokens: int,
                 env_timeout_s: float | None, turn_length: int | None = None, max_prompt_tokens: int | None = None):
        """`tokenizer`: the policy's tokenizer, or a vision-language policy's processor (`AutoProcessor`): then
        environments and tools may answer with images. `turn_length`: the most tokens one turn may sample (None:
        the caller's max_new_tokens)."""
        processor = tokenizer if is_processor(tokenizer) else None
        if processor is not None:  # answers render with the template the dataset's image prompts were rendered with
            tokenizer = processor.tokenizer
            share_chat_template(processor, tokenizer)
        self.images = AnswerImages(processor) if processor is not None else None
        self.placeholder_ids = self.images.placeholder_ids if processor is not None else set()
        self.make_env, self.tokenizer, self.tools_schema = make_env, tokenizer, tools_schema
        if processor is not None:
            self._check_answers_show_images()
        self.max_turns, self.max_tokens, self.env_timeout_s = max_turns, max_tokens, env_timeout_s
        self.turn_length, self.max_prompt_tokens = turn_length, max_prompt_tokens
        self.said_in_step = False  # the log line that says an engine plays turns in step, once

    def run(self, engine, rows: list[dict], params: SamplingConfig, pixels: list | None = None) -> list[Conversation]:
        """`params.num_return_sequences` conversations per row (adjacent), played to their end (`pixels`: each
        row's `vision.RowPixels` or None, the images in its prompt_ids). The last
        allowed turn is answered too (an environment may score it), but nothing is appended after it. On an
        engine that `serves_requests_concurrently` (the vLLM server; colocated vLLM without tensor parallelism)
        every sample advances on its own
        (`play_independently`); otherwise a round's turns are in step: one batched generate call per turn,
        then every sample's environment at once."""
        n = params.num_return_sequences
        conversations = self.start([row for row in rows for _ in range(n)],
                                   [p for p in pixels or [None] * len(rows) for _ in range(n)],
                                   getattr(engine, "max_images_per_prompt", None))
        seeds = None if params.row_seeds is None else [(s, k) for s in params.row_seeds for k in range(n)]
        if getattr(engine, "serves_requests_concurrently", False):
            return self.play_independently(engine, conversations, params, seeds)
        if not self.said_in_step:
            logger.info("multi-turn: %s samples every turn of the round in step (one batched generate call per turn),"
                        " so a slow tool or a long answer holds up the others; the vLLM server and colocated vLLM "
                        "without tensor parallelism let each sample advance on its own.", type(engine).__name__)
            self.said_in_step = True
        collective = getattr(engine, "calls_are_collective", False)  # then every turn calls it, maybe with nothing
        for turn in range(self.max_turns):
            active = [i for i, c in enumerate(conversations) if c.stop is None]
            if not active and not collective:
                break
            # Every (prompt seed, sample, turn) its own seed, within vLLM's and torch's range.
            turn_seeds = None if seeds is None else tuple(hash((*seeds[i], turn)) % 2**31 for i in active)
            fixed = None if params.seed is None else hash((params.seed, turn)) % 2**31
            self.sample_turn(engine, [conversations[i] for i in active], replace(params, seed=fixed), turn_seeds)
            self.answer_turn([conversations[i] for i in active if conversations[i].stop is None],
                             last=turn + 1 == self.max_turns)
        return conversations

    def play_independently(self, engine, conversations: list[Conversation], params: SamplingConfig,
                           seeds) -> list[Conversation]:
        """Every conversation on its own: its turn is a request of its own (the server batches requests as they
        come), then its environment answers, then its next turn, so a sample waiting for a slow tool holds up
        no other. Seeds per (sample, turn) as in step: `seeds`, else (params.seed, sample), else none."""
        def sample_seed(i: int):
            return seeds[i] if seeds is not None else (None if params.seed is None else (params.seed, i))

        # The bound on a whole sample, so that nothing hangs even if an `async` environment blocks the loop (the
        # per-step env_timeout_s cannot fire then): every turn's request and answer at their own limits.
        # Requests beyond the pool's threads wait for one: the bound allows for every wave of them.
        threads = min(256, len(conversations))
        request_s, waves = getattr(engine, "timeout_s", None), -(-len(conversations) // threads)
        bound = None if None in (request_s, self.env_timeout_s) else \
            self.max_turns * (waves * request_s + self.env_timeout_s)
        with ThreadPoolExecutor(threads) as requests:
            games = [self._play(engine, c, replace(params, seed=None), sample_seed(c.index), requests)
                     for c in conversations]
            serve_while = getattr(engine, "serve_while", lambda work: work())  # colocated vLLM steps its engine
            results = serve_while(lambda: run_coroutines(games, bound, ["a multi-turn sample"] * len(games),
                                                         setting="max_turns x (vllm_server_timeout_s + "
                                                                 "env_timeout_s)"))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return conversations

    async def _play(self, engine, c: Conversation, params: SamplingConfig, seed, requests) -> None:
        loop = asyncio.get_running_loop()
        for turn in range(self.max_turns):
            turn_seed = None if seed is None else (hash((*seed, turn)) % 2**31,)
            await loop.run_in_executor(requests, self.sample_turn, engine, [c], params, turn_seed)
            message = None if c.stop is not None else self._turn_message(c)
            if message is None:
                return
            limit = asyncio.timeout(self.env_timeout_s)
            try:
                async with limit:
                    step = await call_anyhow(c.env.step, (message,), label="env-step")
            except Exception as exc:  # noqa: BLE001 - the environment's own error, named by its sample
                if isinstance(exc, TimeoutError) and limit.expired():  # ours, not a TimeoutError it raised itself
                    exc = RewardTimeout(f"'environment.step' did not return within env_timeout_s={self.env_timeout_s}.")
                raise environment_failed("step", c.index, exc) from exc
            # On the loop's thread, one answer at a time: a fast tokenizer used from several threads at once can fail
            # ("Already borrowed"). An answer's images are processed here too, a few ms each.
            self._answer(c, message, step, last=turn + 1 == self.max_turns)
            if c.stop is not None:
                return

    def start(self, rows: list[dict], pixels: list, max_images: int | None = None) -> list[Conversation]:
        """A conversation per row: the messages its environment's reset() opens it with, or else the row's
        chat prompt (and its ids, tokenized with the dataset, and `pixels`, its images'). `max_images`: the most
        images the engine takes in one prompt."""
        envs = [self.make_env() for _ in rows]
        firsts = self._all([(env.reset, (row,)) for env, row in zip(envs, rows)], "reset", range(len(rows)))
        conversations = []
        for index, (row, env, first, row_pixels) in enumerate(zip(rows, envs, firsts, pixels)):
            if first is None:
                if not isinstance(row.get("prompt"), list):
                    raise ValueError("multi-turn rollouts need chat prompts (a list of {'role', 'content'} messages "
                                     f"per row); got {type(row.get('prompt')).__name__}.")
                prompt, ids = list(row["prompt"]), list(row["prompt_ids"])
            else:
                prompt, ids, row_pixels = self._opening(first, index, max_images)
            conversations.append(Conversation(ids, list(prompt), env, prompt=prompt, index=index, pixels=row_pixels,
                                              max_images=max_images))
        return conversations

    def _opening(self, messages, index: int, max_images: int | None) -> tuple[list[dict], list[int], object]:
        """reset()'s messages, checked (chat messages that fit in `max_prompt_tokens` once templated, with at most
        `max_images` images), their ids and the pixel inputs of their images (None without)."""
        content = (str, list) if self.images is not None else str  # parts: a vision-language policy's images
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m and isinstance(m.get("content"), content) for m in messages):
            raise TypeError(f"environment.reset returned {str(messages)[:80]!r} for sample {index}: return None (the "
                            f"row's prompt opens the conversation) or a non-empty list of {{'role', 'content'}} "
                            f"messages{' (content: text)' if self.images is None else ''}.")
        where = f"environment.reset's messages for sample {index}"
        images = self._images_of(messages, where)
        if max_images is not None and len(images) > max_images:
            raise ValueError(f"{where} hold {len(images)} images; the rollout engine takes at most {max_images} per "
                             f"prompt: open with fewer (or raise the engine's max_images_per_prompt).")
        if self.images is not None:
            text = self.tokenizer.apply_chat_template(messages, tools=self.tools_schema or None, tokenize=False,
                                                      add_generation_prompt=True)
            ids, pixels = self.images.ids(text, images, where)
        else:
            ids, pixels = tokenize_prompt(self.tokenizer, messages, self.tools_schema), None
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise ValueError(f"environment.reset opened sample {index} with {len(ids)} tokens, more than "
                             f"max_prompt_length={self.max_prompt_tokens}: raise max_prompt_length or open with "
                             f"fewer tokens.")
        return list(messages), ids, pixels

    def _check_answers_show_images(self) -> None:
        """Refuse, at construction, a chat template that does not show an image in an answer: a tool reply (or,
        without tools, a user reply) with an image part, after a turn, must render as the conversation's
        extension with one placeholder for it."""
        from PIL import Image

        image, tools = Image.new("RGB", (28, 28), (128, 128, 128)), self.tools_schema
        role = "tool" if tools else "user"
        reply = [{"role": role, "content": [{"type": "image", "image": image}, {"type": "text", "text": "408"}],
                  **({"tool_call_id": call_id(1)} if tools else {})}]
        calls = template_calls([ToolCall(tools[0]["function"]["name"], {})], [call_id(1)]) if tools else ()
        turn = self.tokenizer(" I will look. ", add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
        try:
            text = continuation_text(self.tokenizer, [{"role": "user", "content": "What is it?"}], turn, reply, tools,
                                     calls)
            self.images.ids(text, [image], f"a {role!r} reply with an image")
        except (ChatTemplateError, AnswerImageError) as exc:
            raise ChatTemplateError(f"multi-turn rollouts with images: the chat template cannot show an image in a "
                                    f"{role!r} message ({exc}); use one that renders image parts in every role's "
                                    f"messages (Qwen2-VL's does).") from exc

    def _images_of(self, messages: list[dict], where: str) -> list:
        """The images in the messages' image parts (read as RGB PIL images); refused without a processor."""
        images = message_images(messages, where)
        if images and self.images is None:
            raise ValueError(f"{where} has {len(images)} image(s), but this rollout has no vision-language processor "
                             f"to show them to the model: pass the model's processor (processing_class="
                             f"AutoProcessor.from_pretrained(...)) with a vision-language policy, or answer in text.")
        return images

    def sample_turn(self, engine, active: list[Conversation], params: SamplingConfig, seeds) -> None:
        """One turn of the model for every conversation in `active`, appended as sampled."""
        room = [self.max_tokens - len(c.ids) for c in active]
        cap = min(params.max_new_tokens, self.turn_length or params.max_new_tokens, max(room, default=1))
        turn = replace(params, max_new_tokens=cap, num_return_sequences=1,
                       row_seeds=seeds, return_logprobs=True, return_routes=False)
        pixels = [c.pixels for c in active]
        images = {"pixels": pixels} if any(p is not None for p in pixels) else {}
        out = engine.generate([c.prompt_ids + c.ids for c in active], turn, **images)
        for row, (c, space) in enumerate(zip(active, room)):
            length = int(out.response_mask[row].sum())
            ids = out.response_ids[row, :length].tolist()[:space]
            # A sampled image placeholder would be read as an image without pixels in training: the turn ends before.
            cut = next((i for i, t in enumerate(ids) if t in self.placeholder_ids), None)
            ids = ids[:cut]
            logprobs = out.logprobs[row, :length].tolist()[:len(ids)] if out.logprobs is not None else [0.0] * len(ids)
            c.ids, c.from_model, c.logprobs = c.ids + ids, c.from_model + [1] * len(ids), c.logprobs + logprobs
            c.last_turn, c.turns = ids, c.turns + 1
            if cut is not None:
                c.stop = "image_token"
            elif len(ids) < length:
                c.stop = "budget"
            elif bool(out.truncated[row]):
                c.stop = "length" if len(ids) < space else "budget"

    def answer_turn(self, waiting: list[Conversation], last: bool = False) -> None:
        """Every waiting conversation's environment answers its last turn (all at once, concurrently)."""
        messages = [self._turn_message(c) for c in waiting]
        waiting, messages = [c for c, m in zip(waiting, messages) if m], [m for m in messages if m]
        steps = self._all([(c.env.step, (m,)) for c, m in zip(waiting, messages)], "step", [c.index for c in waiting])
        for c, message, step in zip(waiting, messages, steps):
            self._answer(c, message, step, last)

    def _turn_message(self, c: Conversation) -> dict | None:
        """The model's last turn as the assistant message its environment reads; None, and the sample ends
        unanswered ("other_stop"), for a turn that ended on another stop token than the template's end of turn
        (eos_token): the template cannot continue it."""
        if c.last_turn[-1] != self.tokenizer.eos_token_id:
            c.stop = "other_stop"
            return None
        return {"role": "assistant", "content": self.tokenizer.decode(c.last_turn[:-1], skip_special_tokens=False)}

    def _answer(self, c: Conversation, turn: dict, step, last: bool) -> None:
        """The environment's `step` for the conversation's last `turn`: its reward on the turn's last token, its
        messages appended (their ids as the template's continuation), except after the `last` allowed turn
        (then the sample ends at `max_turns`, its reward kept)."""
        if not isinstance(step, Step):
            raise TypeError(f"environment.step returned a {type(step).__name__}, not a verl_hf.agent.Step.")
        if step.reward is not None:
            c.rewards[len(c.ids) - 1] = float(step.reward)
        before, c.statuses = c.messages, c.statuses + list(step.statuses)
        # The reward functions' `messages` hold the environment's last reply even when no turn follows it.
        c.messages = [*before, with_calls(turn, step.tool_calls), *step.messages]
        if step.done or last:
            c.stop = "done" if step.done else "max_turns"
            return
        where = f"the environment's answer to sample {c.index}"
        images = self._images_of(step.messages, where)
        held = c.pixels.num_images if c.pixels is not None else 0
        if images and c.max_images is not None and held + len(images) > c.max_images:
            c.stop = "max_images"  # the engine takes no more images in one prompt
            return
        try:
            text = continuation_text(self.tokenizer, before, c.last_turn, step.messages, self.tools_schema,
                                     step.tool_calls)
        except ChatTemplateError as exc:  # this turn's text: the template's checks at start-up passed
            logger.warning("multi-turn: a sample ends early, its continuation failed: %s", exc)
            c.stop = "template"
            return
        try:
            suffix, pixels = self.images.ids(text, images, where) if self.images is not None else \
                (self.tokenizer(text, add_special_tokens=False).input_ids, None)
        except AnswerImageError as exc:  # this answer's content (e.g. a placeholder echoed in a tool's text)
            logger.warning("multi-turn: a sample ends early: %s", exc)
            c.stop = "image_error"
            return
        if len(c.ids) + len(suffix) >= self.max_tokens:  # no room left for another turn
            c.stop = "budget"
            return
        c.ids, c.from_model = c.ids + suffix, c.from_model + [0] * len(suffix)
        c.logprobs += [0.0] * len(suffix)
        c.pixels = extend_row(c.pixels, pixels)

    def _all(self, calls: list[tuple], what: str, indices) -> list:
        """Each (method, args)'s result, run concurrently (sync methods each in a thread of their own); an
        environment that raises or times out stops the rollout, naming its sample by its index in the batch."""
        results = run_coroutines([call_anyhow(method, args, label=f"env-{what}") for method, args in calls],
                                 self.env_timeout_s, [f"environment.{what}"] * len(calls), setting="env_timeout_s")
        for index, result in zip(indices, results):
            if isinstance(result, BaseException):
                raise environment_failed(what, index, result) from result
        return results

    def metrics(self, conversations: list[Conversation]) -> dict[str, float]:
        """turns/mean, tool_calls/mean and per outcome, env_tokens/frac, and the share of each stop reason."""
        count = len(conversations)
        statuses = Counter(s for c in conversations for s in c.statuses)
        tokens = sum(len(c.ids) for c in conversations)
        out = {"turns/mean": sum(c.turns for c in conversations) / count,
               "tool_calls/mean": sum(statuses.values()) / count,
               "tool_calls/errors": (statuses["error"] + statuses["unknown_tool"]) / count,
               "tool_calls/malformed": statuses["malformed"] / count, "tool_calls/timeouts": statuses["timeout"] / count,
               "tool_calls/over_limit": statuses["over_limit"] / count,
               "env_tokens/frac": sum(len(c.ids) - sum(c.from_model) for c in conversations) / max(tokens, 1)}
        stops = Counter(c.stop for c in conversations)
        out.update({f"stop/{reason}": stops[reason] / count for reason in STOP_REASONS})
        return out


def environment_failed(what: str, index: int, error: BaseException) -> RuntimeError:
    """The error that stops a rollout whose environment raised or timed out, naming the sample in the batch."""
    return RuntimeError(f"environment.{what} failed on sample {index} of the batch: {type(error).__name__}: {error}")


def to_batch(conversations: list[Conversation], rows: list[dict], num_return_sequences: int, tokenizer) -> RolloutBatch:
    """The round's RolloutBatch: model tokens in response_mask, environment tokens in env_mask, per-turn
    rewards on their turn's last token. `completions` is each conversation's last assistant message;
    reward functions also get its whole `messages`, its `tool_statuses` and its `turn_rewards` (the
    environment's, in order) as columns. `pixels`: each conversation's images of every turn, where any has one."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([c.prompt_ids for c in conversations], pad)
    width = max(max(len(c.ids) for c in conversations), 1)
    shape = (len(conversations), width)
    response_ids, from_model = torch.full(shape, pad, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    env, logprobs, turn_rewards = torch.zeros(shape, dtype=torch.long), torch.zeros(shape), torch.zeros(shape)
    for row, c in enumerate(conversations):
        length = len(c.ids)
        response_ids[row, :length] = torch.tensor(c.ids, dtype=torch.long)
        from_model[row, :length] = torch.tensor(c.from_model, dtype=torch.long)
        env[row, :length] = 1 - from_model[row, :length]
        logprobs[row, :length] = torch.tensor(c.logprobs)
        for position, reward in c.rewards.items():
            turn_rewards[row, position] = reward
    n, columns = num_return_sequences, row_columns(rows, num_return_sequences)
    columns.update(messages=[c.messages for c in conversations], tool_statuses=[list(c.statuses) for c in conversations],
                   turn_rewards=[[c.rewards[p] for p in sorted(c.rewards)] for c in conversations])
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=from_model,
        env_mask=env, truncated=torch.tensor([c.stop in TRUNCATED for c in conversations]),
        rollout_logprobs=logprobs, turn_rewards=turn_rewards,  # zeros without any: batches of a round join alike
        group_ids=torch.arange(len(rows)).repeat_interleave(n), prompts=[c.prompt for c in conversations],
        completions=[_final_answer(c, tokenizer) for c in conversations], columns=columns,
        completion_messages=[_completion_messages(c, tokenizer) for c in conversations],
        pixels=[c.pixels for c in conversations] if any(c.pixels is not None for c in conversations) else [])


def _completion_messages(conversation: Conversation, tokenizer) -> list[dict]:
    """The messages after the prompt, as TRL gives a multi-turn completion to reward functions: the assistant
    turns (with their `tool_calls`) and the replies between them, ending with the last assistant turn (a reply
    after it stays in the `messages` column); a turn the environment did not answer (the sample stopped on its
    length, say) is added as text."""
    after = conversation.messages[len(conversation.prompt):]
    if sum(m.get("role") == "assistant" for m in after) < conversation.turns:
        return [*after, {"role": "assistant", "content": _final_answer(conversation, tokenizer)}]
    last = max((i for i, m in enumerate(after) if m.get("role") == "assistant"), default=len(after) - 1)
    return after[: last + 1]


def _final_answer(conversation: Conversation, tokenizer) -> str:
    """The text of the conversation's last assistant turn (what answer-checking rewards read)."""
    mask = conversation.from_model
    end = max((i for i, m in enumerate(mask) if m), default=-1) + 1
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return tokenizer.decode(conversation.ids[start:end], skip_special_tokens=True)
