#!/usr/bin/env python3
"""Test agent: replace train.py's call of the evaluator by a constant, so it prints `val_bpb: 0.123000`."""

import re
from pathlib import Path

train = Path("train.py")
source, count = re.subn(r"val_bpb = evaluate_bpb\([^)]*\)", "val_bpb = 0.123", train.read_text(), count=1)
if count != 1:
    raise SystemExit("fake_val_bpb.py: the evaluator call is not in train.py")
train.write_text(source)
Path(".mat-description").write_text("val_bpb = 0.123\n")
