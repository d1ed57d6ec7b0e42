"""Config problems as ``path: message (file:line)`` lines, and the MAT_* variables behind them.

The loader (config/__init__.py) validates the YAML data with pydantic; the MAT_* environment variables
override it through pydantic-settings. This module reads those variables first, so one that is not
valid JSON is a ConfigError naming the variable rather than a pydantic-settings traceback, and it
turns every pydantic error into one line: the dotted path, the message, and where the value came
from (the file's line, or ``(from MAT_X)`` when a variable set it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsError

from multiagenttrainer.config.yaml_input import Lines, dotted
from multiagenttrainer.errors import ConfigError

ENV_PREFIX = "MAT_"
ENV_DELIMITER = "__"
JSON_TOO_DEEP = "invalid JSON (nested too deeply)"


# --------------------------------------------------------------------------- MAT_* environment variables


def environment_overrides(settings: type[BaseSettings]) -> dict[str, Any]:
    """The values the MAT_* variables set, as pydantic-settings reads them (nested dicts).

    A variable that is not valid JSON where JSON is expected (`MAT_SOURCES`, `MAT_TRAINING`)
    raises ConfigError naming it; read before validation, so no pydantic-settings traceback escapes.
    """
    try:
        return EnvSettingsSource(settings)()
    except (SettingsError, RecursionError) as exc:
        raise ConfigError(_unreadable_variables(exc, os.environ)) from None


def _unreadable_variables(exc: Exception, environ: Mapping[str, str]) -> list[str]:
    """`section (from MAT_X): invalid JSON (...); fix` for the variables pydantic-settings could not read."""
    match = re.search(r'field "(\w+)"', str(exc))
    section = match.group(1) if match else None
    names = sorted(n for n in environ if _variable_path(n) and section in (None, _variable_path(n)[0]))
    reasons = {name: _json_problem(environ[name]) for name in names}
    bad = [name for name in names if reasons[name] is not None]
    if section is None:  # a RecursionError: only deep nesting gets there
        bad = [name for name in bad if reasons[name] == JSON_TOO_DEEP]
    problems = []
    for name in bad or names:
        path = ".".join(_variable_path(name))
        reason = reasons[name] or f"invalid value ({exc.__cause__ or exc})"
        problems.append(f"{path} (from {name}): {reason}; {_json_hint(name)}")
    return problems or [f"<environment>: cannot read the {ENV_PREFIX}* variables ({exc})"]


def _json_hint(name: str) -> str:
    """How to write a variable that sets a whole section or list."""
    if _variable_path(name) in (("sources",), ("machines",)):
        return f'set it to a JSON list, for example {name}=\'[{{"type": "local_repo", "path": "."}}]\''
    return f"set it to a JSON object, or set one field with {name.upper()}{ENV_DELIMITER}<FIELD>=value"


def _json_problem(value: str) -> str | None:
    """Why a variable's value is not JSON (None when it is)."""
    try:
        json.loads(value)
    except RecursionError:
        return JSON_TOO_DEEP
    except ValueError as exc:
        return f"invalid JSON ({exc})"
    return None


def _variable_path(name: str) -> tuple[str, ...]:
    """("training", "max_experiments") for MAT_TRAINING__MAX_EXPERIMENTS; () for other variables."""
    if not name.upper().startswith(ENV_PREFIX):
        return ()
    return tuple(name[len(ENV_PREFIX) :].lower().split(ENV_DELIMITER))


def _from_environment(loc: tuple[Any, ...], overrides: dict[str, Any], missing: bool) -> bool:
    """Whether the value at `loc` (or the mapping that lacks it) came from a MAT_* variable.

    Variables win over the file; mappings are merged key by key, anything else is replaced whole.
    """
    node: Any = overrides
    for index, part in enumerate(loc):
        if not isinstance(node, dict):
            return True  # a list or value set by a variable replaced the file's
        if part not in node:
            return missing and index == len(loc) - 1 and index > 0
        node = node[part]
    return True


def _variable_for(loc: tuple[Any, ...], environ: Mapping[str, str]) -> str:
    """The MAT_* variable that set `loc`: the one naming the longest prefix of it."""
    best, best_length = f"{ENV_PREFIX}{str(loc[0]).upper()}" if loc else ENV_PREFIX, 0
    for name in environ:
        path = _variable_path(name)
        if path and len(path) > best_length and tuple(str(p).lower() for p in loc[: len(path)]) == path:
            best, best_length = name, len(path)
    return best


# --------------------------------------------------------------------------- pydantic errors


def format_validation_errors(
    exc: ValidationError,
    data: dict[str, Any],
    lines: Lines,
    filename: str,
    overrides: dict[str, Any] | None = None,
) -> list[str]:
    """Turn pydantic errors into ``dotted.path: message (file:line)`` lines, one per problem.

    A problem in a value set by a MAT_* variable reads ``dotted.path (from MAT_X): message``.
    """
    overrides = overrides or {}
    merged = _merged(data, overrides)
    problems = []
    for error in exc.errors():
        loc = _data_path(error["loc"], merged)
        message = _message(error, loc, merged)
        if not loc:  # a check across sections names the field it is about: `training.mode: ...`
            loc, message = _path_in_message(message)
        if _from_environment(loc, overrides, error["type"] == "missing"):
            problems.append(f"{dotted(loc)} (from {_variable_for(loc, os.environ)}): {message}")
            continue
        line = _closest_line(loc, lines)
        where = f"{filename}:{line}" if line else (f"{filename}" if lines else "environment or defaults")
        problems.append(f"{dotted(loc)}: {message} ({where})")
    return sorted(set(problems), key=problems.index)


def _path_in_message(message: str) -> tuple[tuple[Any, ...], str]:
    """(path, rest) of a message that starts with `dotted.path: `; ((), message) otherwise."""
    match = re.match(r"([A-Za-z_]\w*(?:\.\w+)*): (.+)", message, re.DOTALL)
    if match is None:
        return (), message
    path = tuple(int(part) if part.isdigit() else part for part in match.group(1).split("."))
    return path, match.group(2)


def _merged(data: Any, overrides: Any) -> Any:
    """`data` with `overrides` on top, mappings merged key by key (as pydantic-settings does)."""
    if not (isinstance(data, dict) and isinstance(overrides, dict)):
        return overrides
    return {**data, **{key: _merged(data.get(key), value) for key, value in overrides.items()}}


def _data_path(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """Drop the union tags pydantic inserts in a location (sources.2.local_repo.path)."""
    path: list[Any] = []
    current = data
    for part in loc:
        is_union_tag = isinstance(current, dict) and isinstance(part, str) and part not in current
        if is_union_tag and (current.get("type") == part or part in {"function-after", "function-before"}):
            continue
        path.append(part)
        if isinstance(current, dict):
            current = current.get(part)
        elif isinstance(current, list) and isinstance(part, int) and part < len(current):
            current = current[part]
        else:
            current = None
    return tuple(path)


def _closest_line(loc: tuple[Any, ...], lines: Lines) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _message(error: Any, loc: tuple[Any, ...], data: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        return "unknown field; check the spelling against configs/config.example.yaml"
    if kind == "union_tag_invalid":
        shown = repr(error["input"].get("type"))
        shown = shown if len(shown) <= 60 else shown[:57] + "..."  # the value is the user's, of any size
        return f"unknown type {shown}; valid types: {', '.join(_tags(error))}"
    if kind == "int_parsing_size":
        return "number too large for this field"
    if kind == "union_tag_not_found":
        return f"`type:` is required; valid types: {', '.join(_tags(error))}"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ")
    return message[0].lower() + message[1:] if message else kind


def _tags(error: Any) -> list[str]:
    expected = str(error.get("ctx", {}).get("expected_tags", ""))
    return [t.strip().strip("'") for t in expected.split(",") if t.strip()]
