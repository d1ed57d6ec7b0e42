#!/usr/bin/env python3
"""Test agent: put a syntax error into ./train.py, so the training run crashes."""

from pathlib import Path

train = Path("train.py")
train.write_text(train.read_text() + "\ndef broken(:\n    pass\n")
Path(".mat-description").write_text("break train.py with a syntax error\n")
print("break_train.py: train.py no longer parses")
