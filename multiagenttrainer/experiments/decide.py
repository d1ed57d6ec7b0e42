"""The keep/discard rule of autoresearch, as a pure function."""

from __future__ import annotations

import math

from multiagenttrainer.history import Status


def decide(val_bpb: float | None, best: float | None) -> Status:
    """`crash` without a finite val_bpb; `keep` for the first result or one strictly below `best`."""
    if val_bpb is None or not math.isfinite(val_bpb):
        return "crash"
    if best is None or val_bpb < best:
        return "keep"
    return "discard"
