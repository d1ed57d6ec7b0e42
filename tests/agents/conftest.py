"""Workspaces for agent tests: the built-in template rendered into `<run>/workspace` (no data, no git)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiagenttrainer.workspace.builtin import render_template


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh template workspace inside a run directory, as the loop lays it out."""
    root = tmp_path / "run" / "workspace"
    render_template(root, 60, None)
    return root
