"""Reading a row's images: PIL images, file paths, raw bytes, or the dicts of `datasets.Image(decode=False)`.

Every failure names the row and the column and says what was found, before any model runs (an unreadable path
found only when the engine samples would waste a whole round).

See it work: tests/test_vision_inputs.py.
"""

from __future__ import annotations

import io
import os


def read_image(value, where: str):
    """One image as an RGB `PIL.Image`; `where` names it in errors (e.g. "train row 3, column 'images'")."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # datasets.Image(decode=False)
        value = value.get("bytes") or value.get("path")
    try:
        if isinstance(value, Image.Image):
            image = value
        elif isinstance(value, (bytes, bytearray)):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, (str, os.PathLike)):
            if not os.path.isfile(value):
                raise ValueError(f"{where}: no image file at {str(value)!r}; give an existing path, the image's "
                                 f"bytes or a PIL image.")
            image = Image.open(value)
        else:
            raise ValueError(f"{where}: {type(value).__name__} is not an image; give a PIL image, a file path or "
                             f"the image's bytes.")
        if 0 in image.size:
            raise ValueError(f"{where}: the image is empty ({image.width}x{image.height} pixels).")
        return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{where}: cannot read the image ({error}); give a PNG/JPEG/... file, its bytes or a PIL "
                         f"image.") from error


def message_images(messages: list[dict], where: str) -> list:
    """The images in chat messages' image parts ({"type": "image", "image": <PIL image, path or bytes>}, or "path"
    in place of "image"), in order, as RGB PIL images: what an environment or a tool answers with. `where` names
    the messages in errors (e.g. "the environment's answer to sample 3")."""
    images = []
    for m, part in image_parts_of(messages, where):
        value = part.get("image", part.get("path"))
        if value is None:
            raise ValueError(f"{where}: message {m} has an image part without its image; give "
                             f"{{'type': 'image', 'image': <PIL image, file path or bytes>}}.")
        images.append(read_image(value, f"{where}, message {m}, image {len(images)}"))
    return images


def image_parts_of(messages: list, where: str) -> list[tuple[int, dict]]:
    """(message index, part) of each image part of chat messages, in order. Refused, naming the message: parts
    that would render a placeholder with nothing read behind it (`image_url`, video parts, an image by URL)."""
    found = []
    for m, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image_url", "video", "video_url") or (kind == "image" and "url" in part
                                                                 and part.get("image", part.get("path")) is None):
                raise ValueError(f"{where}: message {m} has a {kind!r} part{' with a url' if kind == 'image' else ''}, "
                                 f"which is not read here (URLs are not fetched, videos not taken): give each image "
                                 f"as {{'type': 'image', 'image': <PIL image, file path or bytes>}}.")
            if kind == "image":
                found.append((m, part))
    return found


def row_images(row: dict, column: str, where: str) -> list:
    """The row's images from `column` (one image or a list of them) as RGB PIL images; [] when it has none.
    `where` names the row in errors (e.g. "train row 3")."""
    value = row.get(column)
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [read_image(v, f"{where}, column {column!r}" + (f", image {i}" if len(values) > 1 else ""))
            for i, v in enumerate(values)]
