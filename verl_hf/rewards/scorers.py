"""Pure string scorers: pull a final answer out of a completion and compare it.

Nothing here knows about batches, tensors or datasets; `functions.py` wraps
these into batch reward functions.

GSM8K answers are compared the way the field does (verl's gsm8k reward,
lm-eval-harness's gsm8k task): as *strings* after removing thousands commas,
dollar signs and a trailing full stop. So "1,234" == "1234" and "$5" == "5",
but "72.0" != "72" and "0.50" != "0.5" -- we deliberately do not parse to
numbers, so our scores match the published ones.

See it work: tests/test_rewards.py
"""

from __future__ import annotations

import re

# The marker GSM8K solutions use, followed by one space and the number,
# exactly as verl's gsm8k reward matches it ("####72" without the space
# does not count: strict mode also checks the model learned the format).
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,\$]+)")
# Any run of number-ish characters; candidates without a digit are dropped.
_FLEXIBLE_RE = re.compile(r"(\-?[0-9\.\,\$]+)")
_METHODS = ("strict", "flexible")


def _clean_number(raw: str) -> str | None:
    """Drop commas, '$' and trailing '.'; None if no digit is left."""
    cleaned = raw.replace(",", "").replace("$", "").rstrip(".")
    # "-", "." or "$" alone are punctuation, not an answer.
    return cleaned if any(ch.isdigit() for ch in cleaned) else None


def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """Return the final numeric answer in `text` as a cleaned string, or None.

    strict:   the number right after the LAST "#### " marker.
    flexible: the last number anywhere in the text (no marker needed).
    The result has commas, '$' and a trailing '.' removed; it is not
    otherwise normalised ("72.0" stays "72.0", see the module docstring).
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
        matches = _STRICT_RE.findall(text)
        return _clean_number(matches[-1]) if matches else None
    for raw in reversed(_FLEXIBLE_RE.findall(text)):
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
        return extract_gsm8k_answer(text, method="strict")
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
