"""The Safe-RLHF demo task: reward and cost pull apart.

The reward favours long answers; the cost flags any answer containing the digit 7 (the "forbidden
pattern"). The longer an answer, the likelier it contains a 7, so a policy that only chases reward also
becomes unsafe. Cost is 1 for an unsafe answer and 0 otherwise, so the mean cost is the unsafe rate and
cost_limit bounds it directly.
"""

FORBIDDEN = "7"
TARGET_CHARS = 10


def answer_length(prompts, completions, completion_ids, **columns):
    """Reward in [0, 1]: the answer's length in characters, up to TARGET_CHARS."""
    return [min(len(text.strip()), TARGET_CHARS) / TARGET_CHARS for text in completions]


def forbidden_digit(prompts, completions, completion_ids, **columns):
    """Cost: 1.0 if the answer contains the forbidden digit, else 0.0."""
    return [1.0 if FORBIDDEN in text else 0.0 for text in completions]
