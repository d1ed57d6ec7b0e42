#!/usr/bin/env python3
"""Test agent for agent mode: run one experiment by the book (edit train.py, commit, train, record), but
write val_bpb 0.100000 and `keep` into results.tsv whatever the run printed. Training runs with
$MAT_TEST_PYTHON (an interpreter with torch), else this script's own."""

import os
import re
import subprocess
import sys
from pathlib import Path

train = Path("train.py")
train.write_text(re.sub(r"^(WARMUP_STEPS = )\d+", r"\g<1>1", train.read_text(), count=1, flags=re.M))
subprocess.run(["git", "commit", "-q", "-am", "warm-up of one step"], check=True)
commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True).stdout
with open("run.log", "wb") as log:
    python = os.environ.get("MAT_TEST_PYTHON", sys.executable)
    subprocess.run([python, "train.py"], stdout=log, stderr=subprocess.STDOUT, check=False)
with open("results.tsv", "a") as table:
    table.write(f"{commit.strip()}\t0.100000\t0.4\tkeep\twarm-up of one step\n")
Path(".mat-description").write_text("warm-up of one step\n")
