"""Image prompts: a dataset row's chat messages with image parts, and its images, made into the prompt's token ids
(each image placeholder expanded to that image's tokens) and its pixel inputs by the model's processor.

The ids are made once, when the dataset is prepared (for the length filter and the engines); the pixels again
for each round's rows (they are not kept in the dataset, where they would be stored as nested lists), from the
same rendering, and checked to give the same ids.

See it work: tests/test_vision_inputs.py.
"""

from __future__ import annotations

from .images import image_parts_of, row_images
from .inputs import RowPixels, image_runs, image_token_of, process_row


def image_parts(prompt, where: str = "a prompt") -> int:
    """How many image parts ({"type": "image"}) the chat messages hold: the placeholders the template renders
    (refused: parts that render one with nothing behind it, vision/images.py's `image_parts_of`)."""
    return len(image_parts_of(prompt, where))


class ImagePrompts:
    """Holds: the model's processor (its chat template, tokenizer and image processor) and the name of the
    dataset column with each row's images (one image or a list; PIL images, paths or bytes)."""

    def __init__(self, processor, column: str = "images"):
        self.processor, self.column = processor, column
        # the tokens the model's forward reads as images or videos (never kept in a sampled response); Gemma-3's
        # processor names its image's start marker, its tokenizer the soft tokens the model reads
        tokens = [getattr(processor, name, None) for name in ("image_token_id", "video_token_id")]
        tokens.append(getattr(processor.tokenizer, "image_token_id", None))
        self.placeholder_ids = sorted({t for t in tokens if isinstance(t, int)})

    def prompt_ids(self, row: dict, where: str, tools: list[dict] | None = None) -> list[int]:
        """The row's prompt token ids, its image placeholders expanded (refused: images without matching image
        parts in the messages, or the other way round)."""
        return self._processed(row, where, tools)[0]

    def pixels(self, rows: list[dict], tools: list[dict] | None = None) -> list[RowPixels | None]:
        """Each row's pixel inputs (None for a row without images), made as `prompt_ids` made its ids."""
        out = []
        for i, row in enumerate(rows):
            ids, pixels = self._processed(row, f"row {i} of the batch", tools)
            if "prompt_ids" in row and list(row["prompt_ids"]) != ids:
                raise ValueError(f"row {i} of the batch: its prompt_ids are not what the processor makes of its "
                                 f"prompt and images now; prepare the dataset with this processor.")
            out.append(pixels)
        return out

    def _processed(self, row: dict, where: str, tools) -> tuple[list[int], RowPixels | None]:
        images, prompt = row_images(row, self.column, where), row["prompt"]
        if isinstance(prompt, str):
            if images:
                raise ValueError(f"{where}: {len(images)} image(s) in column {self.column!r} but a text prompt; "
                                 f"give chat messages whose content holds an {{'type': 'image'}} part per image.")
            return self.processor.tokenizer(prompt).input_ids, None
        parts = image_parts(prompt, where)
        if parts != len(images):
            raise ValueError(f"{where}: {len(images)} image(s) in column {self.column!r} but {parts} image "
                             f"part(s) ({{'type': 'image'}}) in the prompt's messages; each image needs its part, "
                             f"in the order of the images.")
        text = self.processor.apply_chat_template(prompt, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)
        marker = getattr(self.processor, "image_token", None)  # what the processor expands, once per image
        ids, pixels = (None, None) if marker and text.count(marker) != len(images) else \
            process_row(self.processor, text, images)
        if ids is None or image_runs(ids, image_token_of(self.processor)) != len(images):
            # e.g. an <|image_pad|> written in the prompt's text: an image token with no pixels behind it
            raise ValueError(f"{where}: its rendered prompt holds another number of image placeholders than its "
                             f"{len(images)} image(s); write no image placeholder token ({marker!r}) in the text "
                             f"(give images as {{'type': 'image'}} parts, the images in column {self.column!r}).")
        return ids, pixels
