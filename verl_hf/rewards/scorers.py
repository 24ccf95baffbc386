"""Pure string scorers: pull a final answer out of a completion and compare it.

Nothing here knows about batches, tensors or datasets; `functions.py` wraps
these into batch reward functions.

GSM8K answers are read as verl 0.9.1's gsm8k reward reads them (verl/utils/reward_score/gsm8k.py), by
default: "strict" takes the number after the last "#### " marker in the completion's last 300 characters,
digits, '.', ',' and a leading '-' only, commas removed; "flexible" takes the last such run anywhere in those
300 characters, as written. Both compare *strings*: "72.0" != "72", and "#### $18" or "#### 18." do not match
"18" (verl scores them 0). The readings this library used before are kept as named options: "lenient" (after
the marker, '$' and a trailing full stop allowed and removed, no clipping) and "lenient_flexible" (the last
number anywhere, commas, '$' and a trailing full stop removed), the `gsm8k_lenient` reward.

See it work: tests/test_rewards.py
"""

from __future__ import annotations

import re

# verl's readings: the marker, one space, then the number ("####72" does not count: strict mode also checks the
# model learned the format), matched on the last 300 characters (verl's _SOLUTION_CLIP_CHARS).
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE_RE = re.compile(r"(\-?[0-9\.\,]+)")
_CLIP_CHARS = 300
# The lenient readings also take '$' inside the number.
_LENIENT_RE = re.compile(r"#### (\-?[0-9\.\,\$]+)")
_LENIENT_FLEXIBLE_RE = re.compile(r"(\-?[0-9\.\,\$]+)")
_METHODS = ("strict", "flexible", "lenient", "lenient_flexible")


def _clean_number(raw: str) -> str | None:
    """Drop commas, '$' and trailing '.'; None if no digit is left."""
    cleaned = raw.replace(",", "").replace("$", "").rstrip(".")
    # "-", "." or "$" alone are punctuation, not an answer.
    return cleaned if any(ch.isdigit() for ch in cleaned) else None


def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """Return the final numeric answer in `text` as a string, or None (see the module docstring).

    strict:           verl's: the number right after the LAST "#### " marker, commas removed.
    flexible:         verl's: the last number anywhere (no marker needed), as written.
    lenient:          the number after the last marker, commas, '$' and a trailing '.' removed.
    lenient_flexible: the last number anywhere, cleaned as lenient.
    """
    if method not in _METHODS:
        raise ValueError(
            f"extract_gsm8k_answer: method={method!r} is not supported; "
            f"use one of {_METHODS}")
    if not isinstance(text, str):
        raise TypeError(
            f"extract_gsm8k_answer: text must be a str, got "
            f"{type(text).__name__} {text!r}; decode token ids first")
    if method == "strict":
        matches = _STRICT_RE.findall(text[-_CLIP_CHARS:])
        return matches[-1].replace(",", "") if matches else None
    if method == "flexible":
        return next((m for m in reversed(_FLEXIBLE_RE.findall(text[-_CLIP_CHARS:])) if m not in ("", ".")), None)
    if method == "lenient":
        matches = _LENIENT_RE.findall(text)
        return _clean_number(matches[-1]) if matches else None
    for raw in reversed(_LENIENT_FLEXIBLE_RE.findall(text)):
        cleaned = _clean_number(raw)
        if cleaned is not None:
            return cleaned
    return None


def _gsm8k_truth(ground_truth) -> str | None:
    """Turn a ground truth (bare answer or full '... #### 72' solution) into
    the same cleaned string form the extractor produces."""
    text = str(ground_truth).strip()
    if "####" in text:
        # A full GSM8K solution: its answer is what follows the last marker.
        return extract_gsm8k_answer(text, method="lenient")
    return _clean_number(text)


def gsm8k_score(completion: str, ground_truth, *, method: str = "strict",
                format_score: float = 0.0, score: float = 1.0) -> float:
    """Score one completion against a GSM8K ground truth.

    Returns `score` if the extracted answer equals the ground truth answer,
    `format_score` if an answer was extracted but differs, and 0.0 if no
    answer could be extracted. `ground_truth` may be a bare answer ("72",
    72, "1,234") or a full GSM8K solution ending in "#### 72".
    """
    truth = _gsm8k_truth(ground_truth)
    if truth is None:
        raise ValueError(
            f"gsm8k_score: ground_truth {ground_truth!r} contains no number; "
            f"pass the answer (e.g. '72') or a solution ending in '#### 72'")
    answer = extract_gsm8k_answer(completion, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == truth else float(format_score)


def _normalize_text(text: str) -> str:
    """Lowercase, strip, and collapse internal whitespace runs to one space."""
    return " ".join(text.split()).lower()


def exact_match_score(completion: str, ground_truth, *,
                      normalize: bool = True) -> float:
    """1.0 if the completion equals the ground truth, else 0.0.

    With normalize=True both sides are stripped, lowercased and have internal
    whitespace collapsed before comparing; with normalize=False the strings
    must be identical.
    """
    truth = str(ground_truth)
    if normalize:
        return float(_normalize_text(completion) == _normalize_text(truth))
    return float(completion == truth)
