"""Offline evaluate metrics."""

from verl_hf.metrics import accuracy_metric


def test_accuracy_hand_example():
    # 3 of 4 predictions equal their reference -> 0.75
    assert accuracy_metric().compute(predictions=[1, 0, 1, 1], references=[1, 1, 1, 1]) == {"accuracy": 0.75}
