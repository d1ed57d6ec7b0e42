"""The keep/discard rule."""

from __future__ import annotations

import math

import pytest

from multiagenttrainer.experiments.decide import decide


@pytest.mark.parametrize(
    ("val_bpb", "best", "expected"),
    [
        (None, None, "crash"),
        (math.nan, 1.0, "crash"),
        (math.inf, None, "crash"),
        (-math.inf, 1.0, "crash"),
        (1.2, None, "keep"),  # the first successful result is the one to beat
        (0.99, 1.0, "keep"),
        (1.0, 1.0, "discard"),  # equal is not better
        (1.01, 1.0, "discard"),
    ],
)
def test_decide(val_bpb: float | None, best: float | None, expected: str) -> None:
    assert decide(val_bpb, best) == expected
