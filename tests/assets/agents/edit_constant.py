#!/usr/bin/env python3
"""Test agent: set LEARNING_RATE in ./train.py (to $EDIT_CONSTANT_VALUE, default 1e-3) and describe it."""

import os
import re
import sys
from pathlib import Path

value = os.environ.get("EDIT_CONSTANT_VALUE", "1e-3")
train = Path("train.py")
source = train.read_text()
updated, count = re.subn(r"^(LEARNING_RATE = )[^\s#]+", rf"\g<1>{value}", source, count=1, flags=re.MULTILINE)
if count != 1:
    sys.exit("edit_constant.py: no LEARNING_RATE line in train.py")
train.write_text(updated)
Path(".mat-description").write_text(f"set LEARNING_RATE to {value}\nsecond line is ignored\n")
print(f"edit_constant.py: LEARNING_RATE = {value}")
print("edit_constant.py: done", file=sys.stderr)
