"""Images in a multi-turn conversation's later messages: what an environment's reset() opens with and what its
step() (or a tool) answers with, made into token ids with each image's placeholder expanded, and pixel inputs that
extend the conversation's own (agent/loop.py).

An image placeholder without its image behind it (a literal `<|image_pad|>` in a tool's text, a template that
renders none for an image part) would reach the model as an image token without pixels: Qwen2-VL refuses the whole
batch, and a batch without any pixels embeds it as text. So every answer's ids are counted against its images;
what does not match is an `AnswerImageError` naming the sample (the loop ends that sample: its text comes from the
environment and the model, not from the run's setup, which `MultiTurnRollout` checks once at start-up).

See it work: tests/test_vision_multiturn.py.
"""

from __future__ import annotations

from .inputs import image_runs, image_token_of, process_row
from .prompts import ImagePrompts


class AnswerImageError(ValueError):
    """One answer's images cannot be shown to the model (a placeholder without its image, an image the processor
    cannot take)."""


class AnswerImages:
    """Holds: the vision-language policy's processor, the id its images' placeholder runs are made of, and every
    placeholder id the model reads as an image or a video (`ImagePrompts.placeholder_ids`)."""

    def __init__(self, processor):
        self.processor = processor
        self.image_token_id = image_token_of(processor)
        if self.image_token_id is None:
            raise ValueError(f"{type(processor).__name__} names no image token (image_token_id on it or its "
                             f"tokenizer): multi-turn rollouts cannot tell where an answer's images stand; pass the "
                             f"model's own processor.")
        self.placeholder_ids = set(ImagePrompts(processor).placeholder_ids)

    def ids(self, text: str, images: list, where: str):
        """(ids, pixels) of `text` (rendered messages): each image's placeholder expanded as the processor expands
        it, and the pixel inputs of `images` (None without). AnswerImageError: a processor error, or another count
        of placeholder runs than of images (a template that renders no placeholder for them, a placeholder given
        in text)."""
        try:
            ids, pixels = process_row(self.processor, text, images)
        except Exception as error:  # noqa: BLE001 - e.g. Gemma-3's "Prompt contained 0 image tokens but received 1
            # images", Qwen2-VL's StopIteration for more placeholders than images, an aspect ratio over 200
            raise AnswerImageError(f"{where}: the processor cannot take its {len(images)} image(s) "
                                   f"({type(error).__name__}: {error})") from error
        runs = image_runs(ids, self.image_token_id)
        kept = getattr(self.processor, "image_token_id", None)  # Gemma-3's start-of-image marker: once per image
        markers = {t: ids.count(t) for t in self.placeholder_ids - {self.image_token_id}}  # e.g. <|video_pad|>
        if runs != len(images) or any(n != (len(images) if t == kept else 0) for t, n in markers.items()):
            raise AnswerImageError(f"{where}: its ids hold {runs} image placeholder(s) (and {sum(markers.values())} "
                                   f"other image or video marker(s)) for {len(images)} image(s). Give each image as "
                                   f"a {{'type': 'image', 'image': ...}} part of a message whose role the chat "
                                   f"template renders image parts for (Qwen2-VL's renders them in every role), and "
                                   f"no placeholder token in text.")
        return ids, pixels
