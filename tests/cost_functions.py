"""Cost functions loaded by path in tests/test_safety.py (no imports: processes load them by file)."""


def judges_nothing(prompts, completions, completion_ids, **columns):
    return [None] * len(completions)


def always_fails(prompts, completions, completion_ids, **columns):
    raise ValueError("the safety classifier is down")
