#!/usr/bin/env python3
"""Test agent for real autoresearch workspaces that follows autoresearch's original program.md: "no data?
run `uv run prepare.py`", which downloads ClimbMix shards into the data directory. It runs prepare.py
(and its download_data) with the interpreter in $MAT_TEST_PYTHON, then makes a real change to train.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

python = os.environ.get("MAT_TEST_PYTHON", sys.executable)
for command in (
    [python, "prepare.py", "--num-shards", "3"],
    [python, "-c", "import prepare; prepare.download_data(4)"],
):
    done = subprocess.run(command, capture_output=True, text=True)
    print(f"$ {' '.join(command[1:])} -> exit {done.returncode}")
    print((done.stdout + done.stderr)[-600:])
train = Path("train.py")
train.write_text(re.sub(r"^(LEARNING_RATE = )\S+", r"\g<1>2e-3", train.read_text(), count=1, flags=re.M))
Path(".mat-description").write_text("prepare the data as program.md said\n")
