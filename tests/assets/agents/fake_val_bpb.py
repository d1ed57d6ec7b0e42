#!/usr/bin/env python3
"""Test agent: replace train.py's call of the evaluator by a constant, so it prints `val_bpb: 0.123000`."""

from pathlib import Path

train = Path("train.py")
source = train.read_text()
call = "val_bpb = evaluate_bpb(model, EVAL_BATCH_SIZE)"
if call not in source:
    raise SystemExit("fake_val_bpb.py: the evaluator call is not in train.py")
train.write_text(source.replace(call, "val_bpb = 0.123"))
Path(".mat-description").write_text("val_bpb = 0.123\n")
