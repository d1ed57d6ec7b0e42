#!/usr/bin/env python3
"""Test agent: never finish. Starts a child `sleep`, writes "<own pid> <child pid>" to $MAT_TEST_PID_FILE
(default ./.mat-test-pids), then sleeps forever. With --ignore-term it also ignores SIGTERM, so only
SIGKILL stops it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "3600"])
pid_file = Path(os.environ.get("MAT_TEST_PID_FILE", ".mat-test-pids"))
partial = pid_file.with_name(pid_file.name + ".tmp")
partial.write_text(f"{os.getpid()} {child.pid}\n")
partial.replace(pid_file)  # readers never see half a file
print(f"hang.py: pid {os.getpid()}, child sleep {child.pid}", flush=True)
while True:
    time.sleep(3600)
