#!/usr/bin/env python3
"""Test agent: look at the workspace and change nothing."""

from pathlib import Path

print(f"noop.py: train.py has {len(Path('train.py').read_text().splitlines())} lines; changing nothing")
