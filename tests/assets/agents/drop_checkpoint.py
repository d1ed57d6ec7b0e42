#!/usr/bin/env python3
"""Test agent: stop train.py from saving its checkpoint (it still prints an honest val_bpb)."""

from pathlib import Path

train = Path("train.py")
source = train.read_text()
if "    save_checkpoint(model)\n" not in source:
    raise SystemExit("drop_checkpoint.py: no save_checkpoint(model) line in train.py")
train.write_text(source.replace("    save_checkpoint(model)\n", "", 1))
Path(".mat-description").write_text("no checkpoint\n")
