#!/usr/bin/env python3
"""Test agent: edit ./prepare.py (not allowed: the harness must revert it) and ./train.py (allowed)."""

import re
from pathlib import Path

prepare = Path("prepare.py")
text = prepare.read_text()
text = re.sub(r"^EVAL_BYTES = \S+", "EVAL_BYTES = 1_024", text, count=1, flags=re.MULTILINE)
prepare.write_text(text + "\n# edited by edit_prepare.py\n")
train = Path("train.py")
train.write_text(re.sub(r"^(N_LAYER = )\d+", r"\g<1>1", train.read_text(), count=1, flags=re.MULTILINE))
Path(".mat-description").write_text("one layer, and a smaller evaluation in prepare.py\n")
print("edit_prepare.py: edited prepare.py and train.py")
