"""render_template: the three template files copied into a workspace, TIME_BUDGET set."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from multiagenttrainer.errors import ConfigError, ExperimentError
from multiagenttrainer.workspace.builtin import TEMPLATE_FILES, render_template, set_time_budget

TEMPLATE = resources.files("multiagenttrainer.workspace") / "template"


def template_text(name: str) -> str:
    return (TEMPLATE / name).read_text(encoding="utf-8")


def test_copies_the_template_and_changes_only_the_time_budget_line(tmp_path: Path) -> None:
    render_template(tmp_path / "ws", 42, None)
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == sorted(TEMPLATE_FILES)
    for name in ("train.py", "program.md"):
        assert (tmp_path / "ws" / name).read_text(encoding="utf-8") == template_text(name)
    original = template_text("prepare.py").splitlines()
    rendered = (tmp_path / "ws" / "prepare.py").read_text(encoding="utf-8").splitlines()
    changed = [(old, new) for old, new in zip(original, rendered, strict=True) if old != new]
    assert len(changed) == 1
    old, new = changed[0]
    assert old.startswith("TIME_BUDGET = 300  #")
    assert new == old.replace("TIME_BUDGET = 300", "TIME_BUDGET = 42")


def test_rendering_again_restores_edited_files(tmp_path: Path) -> None:
    render_template(tmp_path, 60, None)
    (tmp_path / "train.py").write_text("broken")
    render_template(tmp_path, 90, None)
    assert (tmp_path / "train.py").read_text(encoding="utf-8") == template_text("train.py")
    assert "\nTIME_BUDGET = 90  #" in (tmp_path / "prepare.py").read_text(encoding="utf-8")


def test_a_program_md_override_replaces_the_default(tmp_path: Path) -> None:
    custom = tmp_path / "mine.md"
    custom.write_text("# Only tune the learning rate\n")
    render_template(tmp_path / "ws", 60, custom)
    assert (tmp_path / "ws" / "program.md").read_text() == "# Only tune the learning rate\n"


def test_a_missing_program_md_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"autoresearch\.program_md: .*nope\.md is not a file"):
        render_template(tmp_path / "ws", 60, tmp_path / "nope.md")
    assert not (tmp_path / "ws").exists()


def test_a_time_budget_below_one_second_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="train_time must be at least 1 second"):
        render_template(tmp_path, 0, None)


def test_set_time_budget_needs_exactly_one_budget_line() -> None:
    with pytest.raises(ExperimentError, match="0 `TIME_BUDGET = <seconds>` lines"):
        set_time_budget("MAX_SEQ_LEN = 128\n", 60)
    with pytest.raises(ExperimentError, match="2 `TIME_BUDGET"):
        set_time_budget("TIME_BUDGET = 1  # a\nTIME_BUDGET = 2  # b\n", 60)
    assert set_time_budget("X = 1\nTIME_BUDGET = 300  # s\n", 5) == "X = 1\nTIME_BUDGET = 5  # s\n"
