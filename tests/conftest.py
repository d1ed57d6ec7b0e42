"""Suite-wide isolation: Prefect, mat's own state and torch threads never touch the developer's setup."""

from __future__ import annotations

import os
import tempfile

# Set before anything imports prefect: its settings are read once, at import.
_HOME = tempfile.mkdtemp(prefix="mat-test-home-")
os.environ["PREFECT_HOME"] = os.path.join(_HOME, "prefect")
os.environ["MAT_HOME"] = os.path.join(_HOME, "mat")
os.environ.pop("PREFECT_API_URL", None)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
for _name in [n for n in os.environ if n.startswith("MAT_") and n != "MAT_HOME"]:
    del os.environ[_name]  # a developer's overrides must not leak into tests
