"""Hostile or broken config input: every case is one `path: message (file:line)` ConfigError, fast.

Covers the file (size, encoding, control characters), the YAML (alias bombs, recursive aliases,
depth, long numbers, keys that are not text, duplicate keys), the values (an upper bound on every
size, count, time and port; no infinities) and the MAT_* environment variables (malformed JSON,
wrong types, each named by its variable instead of a file line).
"""

from __future__ import annotations

import time
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from multiagenttrainer.config import Config, load_config, parse_config_text
from multiagenttrainer.config.yaml_input import MAX_CONFIG_BYTES, MAX_DEPTH
from multiagenttrainer.errors import ConfigError
from tests.support.hostile_yaml import ALIAS_BOMB


def problems_of(text: str, tmp_path: Path, name: str = "mat.yaml") -> list[str]:
    """The problems load_config reports for a file holding `text`."""
    file = tmp_path / name
    file.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    return caught.value.problems


# --------------------------------------------------------------------------- the file


def test_a_file_that_is_not_utf8_names_the_byte_and_line(tmp_path: Path) -> None:
    file = tmp_path / "latin1.yaml"
    file.write_bytes(b"corpus:\n  dir: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    assert caught.value.problems == [
        f"{file}: not UTF-8 text (byte 18 is 0xe9); save the file as UTF-8 ({file}:2)"
    ]


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    file = tmp_path / "bom.yaml"
    file.write_bytes(b"\xef\xbb\xbftraining:\n  max_experiments: 4\n")
    assert load_config(file).training.max_experiments == 4


def test_a_control_character_names_its_line(tmp_path: Path) -> None:
    file = tmp_path / "ctl.yaml"
    file.write_text("corpus:\n  dir: a\x01b\n")
    with pytest.raises(
        ConfigError, match=rf"character '\\x01' is not allowed in YAML; remove it \({file}:2\)"
    ):
        load_config(file)


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    file = tmp_path / "huge.yaml"
    file.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"larger than 2 MiB; is this a config file\?"):
        load_config(file)


def test_an_unreadable_file_says_so() -> None:
    unreadable = Path("/proc/self/mem")  # a regular file that fails to read at offset 0, even for root
    with pytest.raises(
        ConfigError, match=r"^/proc/self/mem: cannot read the config file \(Input/output error\)"
    ):
        load_config(unreadable)


# --------------------------------------------------------------------------- aliases, depth, numbers


def test_an_alias_bomb_is_refused_before_anything_expands(tmp_path: Path) -> None:
    # The first six lines of the bomb (531,441 values): enough to cross the bound, small enough
    # that a regression costs this test process hundreds of MB, not all the machine's memory.
    # The whole bomb runs in a memory-limited child in tests/cli/test_config_input_cli.py.
    started = time.monotonic()
    problems = problems_of("".join(ALIAS_BOMB.splitlines(keepends=True)[:6]), tmp_path)
    assert time.monotonic() - started < 2
    (problem,) = problems
    assert problem.startswith("<yaml>: the aliases (*name) here expand to more than 100000 values")
    assert problem.endswith(f"({tmp_path / 'mat.yaml'}:6)")  # l5, 9**6 values, is the first past 100,000


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    (problem,) = problems_of("machines: &m\n  - name: a\n    more: *m\n", tmp_path)
    assert "an alias (*name) refers to a value that contains it" in problem


def test_modest_aliases_and_merge_keys_still_work() -> None:
    text = (
        "machines:\n"
        "  - name: a\n    execution: &ssh {type: ssh, ssh_host: 'me@gpu-1:2222'}\n"
        "  - name: b\n    execution:\n      <<: *ssh\n      ssh_host: gpu-2\n"
    )
    cfg = parse_config_text(text)
    assert [m.execution.ssh_host for m in cfg.machines] == ["me@gpu-1:2222", "gpu-2"]  # type: ignore[union-attr]


@pytest.mark.parametrize("style", ["flow", "block"])
def test_deep_nesting_is_refused_with_its_line(style: str, tmp_path: Path) -> None:
    depth = 5000 if style == "flow" else MAX_DEPTH + 1
    text = (
        "corpus:\n  include: " + "[" * depth + "]" * depth + "\n"
        if style == "flow"
        else "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + "  " * depth + "v: 1\n"
    )
    (problem,) = problems_of(text, tmp_path)
    assert problem.startswith(f"<yaml>: nested deeper than {MAX_DEPTH} levels")
    assert f"({tmp_path / 'mat.yaml'}:" in problem


def test_a_number_with_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    (problem,) = problems_of("corpus:\n  max_file_bytes: " + "9" * 5000 + "\n", tmp_path)
    assert (
        problem
        == f"<yaml>: a number longer than 100 characters; use a smaller one ({tmp_path / 'mat.yaml'}:2)"
    )


# --------------------------------------------------------------------------- keys


def test_keys_that_are_not_text_are_all_reported(tmp_path: Path) -> None:
    file = tmp_path / "mat.yaml"
    problems = problems_of("1: x\ncorpus:\n  yes: true\n  dir: a\n? [a, b]\n: c\n", tmp_path)
    assert problems == [
        f"<root>: key '1' is a number, not text; quote it or fix the indentation ({file}:1)",
        f"<root>: a key is a list or mapping, not text; quote it or fix the indentation ({file}:5)",
        "corpus: key 'yes' is true/false (YAML reads yes, no, on and off as booleans), not text; "
        f"quote it or fix the indentation ({file}:3)",
    ]


def test_duplicate_keys_name_both_lines_at_every_level(tmp_path: Path) -> None:
    file = tmp_path / "mat.yaml"
    text = (
        "corpus:\n  dir: a\n  dir: b\n"
        "sources:\n  - type: local_repo\n    path: /x\n    path: /y\n"
        "corpus:\n  dedupe: false\n"
    )
    assert problems_of(text, tmp_path) == [
        f"corpus: duplicate key, already set on line 1; keep one of them ({file}:8)",
        f"corpus.dir: duplicate key, already set on line 2; keep one of them ({file}:3)",
        f"sources[0].path: duplicate key, already set on line 6; keep one of them ({file}:7)",
    ]


# --------------------------------------------------------------------------- values


def test_oversized_numbers_are_refused_with_path_and_line(tmp_path: Path) -> None:
    file = tmp_path / "mat.yaml"
    problems = problems_of(
        "corpus:\n  max_file_bytes: 1.0e+29\n"
        "training:\n  max_experiments: 100000000000000000000000000\n"
        "finetuner:\n  opensource:\n    learning_rate: .inf\n    max_steps: 0\n"
        "autoresearch:\n  train_time: 99999999\n",
        tmp_path,
    )
    assert problems == [
        f"autoresearch.train_time: input should be less than or equal to 604800 ({file}:10)",
        f"training.max_experiments: input should be less than or equal to 100000 ({file}:4)",
        f"finetuner.opensource.learning_rate: input should be a finite number ({file}:7)",
        f"finetuner.opensource.max_steps: must be -1 (train for num_epochs) or at least 1 ({file}:8)",
        f"corpus.max_file_bytes: number too large for this field ({file}:2)",
    ]


@pytest.mark.parametrize("host", ["gpu:0", "gpu:65536", "me@gpu:ssh", "[::1]:99999", "gpu:"])
def test_ssh_ports_outside_the_tcp_range_are_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"ssh_host: the port must be a number from 1 to 65535"):
        parse_config_text(f"training:\n  execution:\n    type: ssh\n    ssh_host: '{host}'\n")


@pytest.mark.parametrize("host", ["gpu", "me@gpu:22", "[::1]:2222", "fe80::1", "me@[fe80::1]"])
def test_ssh_hosts_with_and_without_ports_are_accepted(host: str) -> None:
    cfg = parse_config_text(f"training:\n  execution:\n    type: ssh\n    ssh_host: '{host}'\n")
    assert cfg.training.execution.ssh_host == host  # type: ignore[union-attr]


def numeric_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, FieldInfo) of every int or float field in the model and the models inside it."""
    found = []
    for name, info in model.model_fields.items():
        for kind in flatten(info.annotation):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += numeric_fields(kind, f"{prefix}{name}.")
            elif kind in (int, float):
                found.append((prefix + name, info))
    return found


def flatten(annotation: Any) -> list[Any]:
    """The plain types inside unions, lists and Annotated."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return flatten(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list):
        return [kind for arg in typing.get_args(annotation) for kind in flatten(arg)]
    return [annotation]


def test_every_size_count_and_time_field_has_an_upper_bound() -> None:
    fields = numeric_fields(Config)
    assert len(fields) > 20
    unbounded = [
        name
        for name, info in fields
        if not any(
            isinstance(m, annotated_types.Le | annotated_types.Lt)
            for m in [*info.metadata, *item_metadata(info.annotation)]
        )
    ]
    assert unbounded == []


def item_metadata(annotation: Any) -> list[Any]:
    """The constraints on the items of a list field (`list[Annotated[float, Field(le=1)]]`)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in item_metadata(arg)]
    if typing.get_origin(annotation) is not list:
        return []
    (item,) = typing.get_args(annotation)
    if typing.get_origin(item) is not typing.Annotated:
        return []
    return [m for extra in typing.get_args(item)[1:] for m in getattr(extra, "metadata", [extra])]


# --------------------------------------------------------------------------- MAT_* variables


def test_invalid_json_in_a_variable_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAT_SOURCES", '[{"type": "local_repo", ')
    with pytest.raises(ConfigError) as caught:
        parse_config_text("{}")
    (problem,) = caught.value.problems
    assert problem.startswith("sources (from MAT_SOURCES): invalid JSON (Expecting property name")
    assert "set it to a JSON list" in problem


def test_a_section_variable_that_is_not_an_object(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MAT_TRAINING", "oops")
    (problem,) = problems_of("training:\n  max_experiments: 3\n", tmp_path)
    assert problem == (
        "training (from MAT_TRAINING): invalid JSON (Expecting value: line 1 column 1 (char 0)); "
        "set it to a JSON object, or set one field with MAT_TRAINING__<FIELD>=value"
    )


def test_deeply_nested_json_in_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAT_MACHINES", "[" * 100_000)
    with pytest.raises(
        ConfigError, match=r"^machines \(from MAT_MACHINES\): invalid JSON \(nested too deeply\)"
    ):
        parse_config_text("{}")


def test_bad_values_from_variables_name_the_variable_not_a_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MAT_TRAINING__MAX_EXPERIMENTS", "1e29")
    monkeypatch.setenv("MAT_CORPUS", '{"max_file_bytes": 1e29, "val_fraction": NaN}')
    monkeypatch.setenv("MAT_SOURCES", '[{"type": "local_repo"}]')
    file = tmp_path / "mat.yaml"
    problems = problems_of("training:\n  output_dir: 7\ncorpus:\n  dir: x\n", tmp_path)
    assert sorted(problems) == sorted(
        [
            "sources[0].path (from MAT_SOURCES): field required",
            "training.max_experiments (from MAT_TRAINING__MAX_EXPERIMENTS): input should be a valid "
            "integer, unable to parse string as an integer",
            f"training.output_dir: input should be a valid string ({file}:2)",
            "corpus.max_file_bytes (from MAT_CORPUS): number too large for this field",
            "corpus.val_fraction (from MAT_CORPUS): input should be a finite number",
        ]
    )


def test_good_variables_still_override_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAT_TRAINING", '{"max_experiments": 5}')
    monkeypatch.setenv("MAT_CORPUS__MAX_FILE_BYTES", "4096")
    cfg = parse_config_text("training:\n  max_experiments: 20\n  output_dir: ./r\n")
    assert (cfg.training.max_experiments, cfg.training.output_dir) == (5, "./r")
    assert cfg.corpus.max_file_bytes == 4096
