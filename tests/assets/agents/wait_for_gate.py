#!/usr/bin/env python3
"""Test agent: wait until the file named by the first argument exists (at most ten minutes), then change
nothing. A test holds a run at its first experiment this way until it has seen what it waits for."""

import sys
import time
from pathlib import Path

gate = Path(sys.argv[1])
deadline = time.monotonic() + 600
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
print(f"wait_for_gate.py: {gate} {'appeared' if gate.exists() else 'never appeared'}")
