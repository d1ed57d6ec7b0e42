"""The hyperparameter constants of a train.py: find them with `ast`, rewrite one literal in place.

A constant is a module-level `UPPER_CASE = <literal>` on one line, where the literal is a number
(`3e-3`, `128`, `-1`), a power (`2**19`) or a flat tuple of numbers (`(0.9, 0.95)`). Rewriting replaces
only the characters of the literal, so comments and the rest of the line stay as they were, and new
values are written in the style of the old ones (`3e-3` -> `6e-3`, `0.4` -> `0.5`, `2**19` -> `2**18`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

Number = int | float
Value = Number | tuple[Number, ...]

_CONSTANT_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
SIGNIFICANT_DIGITS = 4  # new floats are rounded to this many significant digits, so the text stays short


@dataclass(frozen=True)
class Constant:
    """One hyperparameter: its value, the literal's source text and where that text sits."""

    name: str
    value: Value
    text: str
    line: int  # 1-based
    start: int  # UTF-8 byte offsets of the literal within its line, as `ast` reports them
    end: int


# ---------------------------------------------------------------- reading literals


def evaluate_literal(node: ast.expr) -> Value | None:
    """The value of a supported literal node, or None for anything else (names, calls, strings, bools)."""
    if isinstance(node, ast.Tuple):
        items = [evaluate_number(item) for item in node.elts]
        numbers = [item for item in items if item is not None]
        return tuple(numbers) if numbers and len(numbers) == len(items) else None
    return evaluate_number(node)


def evaluate_number(node: ast.expr) -> Number | None:
    """A number literal, a negated one, or an integer power such as `2**19`."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = evaluate_number(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = evaluate_number(node.left), evaluate_number(node.right)
        if isinstance(base, int) and isinstance(exponent, int) and 0 <= exponent <= 64:
            return int(base**exponent)
    return None


def parse_value_text(text: str) -> Value | None:
    """The value of a literal written as text (`6e-3`, `(0.9, 0.95)`, `2**18`); None if unsupported."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return None
    return evaluate_literal(tree.body)


def assignment_target(statement: ast.stmt) -> tuple[str, ast.expr] | None:
    """(name, value node) of `NAME = value` or `NAME: type = value` at module level, else None."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, value = statement.target, statement.value
    else:
        return None
    if isinstance(target, ast.Name) and _CONSTANT_NAME.match(target.id):
        return target.id, value
    return None


def parse_constants(source: str) -> dict[str, Constant]:
    """Every supported UPPER_CASE constant at module level, in file order. Raises SyntaxError."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[str, Constant] = {}
    for statement in tree.body:
        target = assignment_target(statement)
        if target is None:
            continue
        name, node = target
        value = evaluate_literal(node)
        if value is None or node.end_lineno != node.lineno or node.end_col_offset is None:
            continue
        raw = lines[node.lineno - 1].encode("utf-8")[node.col_offset : node.end_col_offset]
        found[name] = Constant(
            name, value, raw.decode("utf-8"), node.lineno, node.col_offset, node.end_col_offset
        )
    return found


# ---------------------------------------------------------------- writing literals


def round_significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """`value` rounded to `digits` significant digits (0 stays 0)."""
    return float(f"{value:.{digits - 1}e}") if value else 0.0


def format_scientific(value: float) -> str:
    """`0.006` -> `6e-3`, `0.0015` -> `1.5e-3`: the short exponent style of `3e-3`."""
    mantissa, exponent = f"{round_significant(value):.{SIGNIFICANT_DIGITS - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def format_number(value: Number, like: str) -> str:
    """Write `value` in the style of the literal text `like` (int, float, exponent or `2**n`)."""
    style = like.strip()
    power = re.fullmatch(r"(\d+)\s*\*\*\s*(\d+)", style)
    if power and isinstance(value, int):
        base = int(power.group(1))
        exponent = exact_exponent(value, base)
        if exponent is not None:
            return f"{base}**{exponent}"
    if isinstance(value, int):
        return f"{value:_}" if "_" in style else str(value)
    if "e" in style.lower():
        return format_scientific(value)
    text = repr(round_significant(value))
    return text if any(mark in text for mark in ".en") else f"{text}.0"


def exact_exponent(value: int, base: int) -> int | None:
    """n such that base**n == value, or None when `value` is not a power of `base`."""
    if base < 2 or value < 1:
        return None
    exponent = 0
    while value % base == 0:
        value //= base
        exponent += 1
    return exponent if value == 1 else None


def format_value(value: Value, like: str) -> str:
    """Write a number or a tuple in the style of `like`, the literal it replaces."""
    if isinstance(value, tuple):
        old_items = [item.strip() for item in like.strip().strip("()").split(",") if item.strip()]
        styles = old_items if len(old_items) == len(value) else [like] * len(value)
        body = ", ".join(format_number(item, style) for item, style in zip(value, styles, strict=True))
        return f"({body},)" if len(value) == 1 else f"({body})"
    return format_number(value, like)


def replace_literal(source: str, constant: Constant, new_text: str) -> str:
    """`source` with the literal of `constant` replaced by `new_text`; every other byte unchanged."""
    lines = source.splitlines(keepends=True)
    raw = lines[constant.line - 1].encode("utf-8")
    if raw[constant.start : constant.end].decode("utf-8") != constant.text:
        raise ValueError(f"{constant.name} is no longer at line {constant.line}; parse the source again")
    updated = raw[: constant.start] + new_text.encode("utf-8") + raw[constant.end :]
    lines[constant.line - 1] = updated.decode("utf-8")
    return "".join(lines)


def describe_change(name: str, old_text: str, new_text: str) -> str:
    """The one-line description of a constant change: `LEARNING_RATE 3e-3 -> 6e-3`."""
    return f"{name} {old_text.strip()} -> {new_text.strip()}"


def changed_constants(before: str, after: str) -> list[tuple[str, str, str]]:
    """(name, old text, new text) for constants present in both sources whose values differ."""
    old, new = parse_constants(before), parse_constants(after)
    return [
        (name, old[name].text, new[name].text)
        for name in old
        if name in new and old[name].value != new[name].value
    ]
