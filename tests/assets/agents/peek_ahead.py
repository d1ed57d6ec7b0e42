#!/usr/bin/env python3
"""Test agent: drop the causal mask from train.py's attention, so the model sees the bytes it predicts."""

from pathlib import Path

train = Path("train.py")
source = train.read_text()
if "is_causal=True" not in source:
    raise SystemExit("peek_ahead.py: no is_causal=True in train.py")
train.write_text(source.replace("is_causal=True", "is_causal=False"))
Path(".mat-description").write_text("bidirectional attention\n")
