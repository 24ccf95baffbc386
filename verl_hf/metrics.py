"""Evaluation metrics as `evaluate.Metric` objects that work offline.

`evaluate.load("accuracy")` fetches its script from the Hub (and fails offline with a hidden cause), so the
metrics we need are defined here as local `evaluate.Metric` subclasses and used directly.

See it work: tests/test_metrics.py.
"""

from __future__ import annotations

import datasets
import evaluate


class Accuracy(evaluate.Metric):
    """Share of predictions equal to their reference: mean(prediction_i == reference_i)."""

    def _info(self):
        return evaluate.MetricInfo(
            description="Share of predictions equal to their reference.",
            citation="",
            inputs_description="predictions, references: lists of ints",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        if not predictions:
            return {"accuracy": 0.0}
        return {"accuracy": sum(int(p == r) for p, r in zip(predictions, references)) / len(predictions)}


def accuracy_metric() -> Accuracy:
    return Accuracy()
