"""Hostile or broken config input through the real `mat` commands: exit 2, a line per problem, no trace."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.hostile_yaml import ALIAS_BOMB

ROOT = Path(__file__).resolve().parents[2]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
MEMORY_LIMIT_BYTES = 1 << 30  # the alias bomb grew past this before it was bounded
BOMB_TIME_LIMIT_S = 30


def limit_memory() -> None:
    """In the child: at most MEMORY_LIMIT_BYTES of address space."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def mat(
    *args: str, env: dict[str, str] | None = None, limited: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run `mat ARGS` with a clean MAT_* environment plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MAT_") or k == "MAT_HOME"}
    return subprocess.run(
        [*MAT, *args],
        cwd=ROOT,
        env={**base, "COLUMNS": "300", "NO_COLOR": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=BOMB_TIME_LIMIT_S * 4,
        check=False,
        preexec_fn=limit_memory if limited else None,
    )


def assert_config_error(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit code 2, every expected line on stderr as `error: ...`, and no traceback anywhere."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    for line in expected:
        assert f"error: {line}" in result.stderr.splitlines(), result.stderr


CASES = {
    "not-utf8": (
        b"corpus:\n  dir: caf\xe9\n",
        "{f}: not UTF-8 text (byte 18 is 0xe9); save the file as UTF-8 ({f}:2)",
    ),
    "number-key": (
        b"corpus:\n  dir: a\n1: x\n",
        "<root>: key '1' is a number, not text; quote it or fix the indentation ({f}:3)",
    ),
    "deep": (
        b"corpus:\n  include: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        "<yaml>: nested deeper than 32 levels; a mat config needs 4, check the indentation ({f}:2)",
    ),
    "huge-float": (
        b"corpus:\n  max_file_bytes: 1.0e+29\n",
        "corpus.max_file_bytes: number too large for this field ({f}:2)",
    ),
    "huge-int": (
        b"corpus:\n  max_file_bytes: 100000000000000000000000000000\n",
        "corpus.max_file_bytes: input should be less than or equal to 1073741824 ({f}:2)",
    ),
    "markup": (
        b'"[/bold]": 1\n',
        "[/bold]: unknown field; check the spelling against configs/config.example.yaml ({f}:1)",
    ),
    "duplicate": (
        b"training:\n  max_experiments: 3\n  max_experiments: 30\n",
        "training.max_experiments: duplicate key, already set on line 2; keep one of them ({f}:3)",
    ),
}
SOURCES_HINT = 'set it to a JSON list, for example MAT_SOURCES=\'[{"type": "local_repo", "path": "."}]\''


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_validate_refuses_broken_files(case: str, tmp_path: Path) -> None:
    content, expected = CASES[case]
    file = tmp_path / f"{case}.yaml"
    file.write_bytes(content)
    assert_config_error(mat("config", "validate", str(file)), expected.format(f=file))


def test_an_alias_bomb_fails_fast_in_bounded_memory(tmp_path: Path) -> None:
    file = tmp_path / "bomb.yaml"
    file.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB.splitlines()) == 10
    started = time.monotonic()
    result = mat("config", "validate", str(file), limited=True)
    assert time.monotonic() - started < BOMB_TIME_LIMIT_S
    assert_config_error(
        result,
        "<yaml>: the aliases (*name) here expand to more than 100000 values; write the values out instead "
        f"({file}:6)",
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "MAT_SOURCES",
            "[{oops",
            "sources (from MAT_SOURCES): invalid JSON (Expecting property name enclosed in double quotes: "
            f"line 1 column 3 (char 2)); {SOURCES_HINT}",
        ),
        (
            "MAT_TRAINING",
            "oops",
            "training (from MAT_TRAINING): invalid JSON (Expecting value: line 1 column 1 (char 0)); "
            "set it to a JSON object, or set one field with MAT_TRAINING__<FIELD>=value",
        ),
        (
            "MAT_TRAINING__MAX_EXPERIMENTS",
            "lots",
            "training.max_experiments (from MAT_TRAINING__MAX_EXPERIMENTS): input should be a valid integer, "
            "unable to parse string as an integer",
        ),
    ],
)
def test_malformed_environment_overrides_name_the_variable(
    variable: str, value: str, expected: str, tmp_path: Path
) -> None:
    file = tmp_path / "mat.yaml"
    file.write_text("training:\n  max_experiments: 3\n")
    assert_config_error(mat("config", "validate", str(file), env={variable: value}), expected)


def test_other_commands_refuse_the_same_input(tmp_path: Path) -> None:
    """`mat ingest` used to accept max_file_bytes: 1e29 and crash while reading files."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("print(1)\n")
    file = tmp_path / "mat.yaml"
    file.write_text(
        f"sources:\n  - type: local_repo\n    path: {project}\ncorpus:\n  dir: {tmp_path / 'corpus'}\n"
        "  max_file_bytes: 1.0e+29\n"
    )
    assert_config_error(
        mat("ingest", "--config", str(file)),
        f"corpus.max_file_bytes: number too large for this field ({file}:6)",
    )
    assert not (tmp_path / "corpus").exists()
    assert_config_error(
        mat("sources", "--config", str(file), env={"MAT_SOURCES": "[1, 2"}),
        "sources (from MAT_SOURCES): invalid JSON (Expecting ',' delimiter: line 1 column 6 (char 5)); "
        'set it to a JSON list, for example MAT_SOURCES=\'[{"type": "local_repo", "path": "."}]\'',
    )


def test_standard_input_gets_the_same_checks() -> None:
    """`mat config validate -` reads bytes: a non-UTF-8 stream is a config error, not a decoding traceback."""
    result = subprocess.run(
        [*MAT, "config", "validate", "-"],
        cwd=ROOT,
        input=b"corpus:\n  dir: caf\xe9\n" + b"a: &a [*a]\n",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "error: <stdin>: not UTF-8 text (byte 18 is 0xe9); save the file as UTF-8 (<stdin>:2)\n"
    )
