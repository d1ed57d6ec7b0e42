"""Reading a config file's YAML safely: the data, the line of every key, and hostile input refused.

A config file is untrusted input. Before any Python value is built from it, the loader refuses,
each as one ``path: message (file:line)`` problem (ConfigError, exit code 2):

- a file over MAX_CONFIG_BYTES, or one that is not UTF-8 (naming the first bad byte and its line);
- nesting deeper than MAX_DEPTH levels, checked while composing so the parser never recurses far;
- more than MAX_NODES values once aliases are expanded (an alias bomb, "billion laughs"): the
  expanded size is computed on the composed node graph, where every alias is one shared node, so
  nothing is expanded before the check; recursive aliases are refused too;
- numbers longer than MAX_NUMBER_CHARS characters;
- mapping keys that are not text (`1:`, `yes:`, `[a, b]:`) and keys given twice in one mapping
  (both lines named); these are collected and reported together.

Aliases and merge keys (`<<: *defaults`) otherwise work as YAML defines them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import yaml
from yaml.error import MarkedYAMLError

from multiagenttrainer.errors import ConfigError

MAX_CONFIG_MIB = 2  # a real config is a few KB; a 10,000-repository list is under 1 MiB
MAX_CONFIG_BYTES = MAX_CONFIG_MIB * 1024 * 1024
MAX_DEPTH = 32  # the deepest real path, finetuner.targets[0].<field>, is 4 levels
MAX_NODES = 100_000  # values after alias expansion
MAX_NUMBER_CHARS = 100  # no config number needs more; Python refuses to parse ints over 4,300 digits

STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"
KEY_KINDS = {
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "true/false (YAML reads yes, no, on and off as booleans)",
    "tag:yaml.org,2002:null": "null",
}

Lines = dict[tuple[Any, ...], int]

TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels; a mat config needs 4, check the indentation"
TOO_MANY = f"more than {MAX_NODES} values; a mat config needs far fewer, is this the right file?"
TOO_MANY_EXPANDED = (
    f"the aliases (*name) here expand to more than {MAX_NODES} values; write the values out instead"
)
RECURSIVE = "an alias (*name) refers to a value that contains it; write the values out instead"
TOO_LONG_NUMBER = f"a number longer than {MAX_NUMBER_CHARS} characters; use a smaller one"


class InputRefused(MarkedYAMLError):
    """The YAML is well formed but over one of the loader's bounds."""


# --------------------------------------------------------------------------- the file


def read_config_text(file: Path) -> str:
    """The file's text; ConfigError when it cannot be read, is too large or is not UTF-8."""
    try:
        with file.open("rb") as handle:
            return read_config_stream(handle, str(file))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"{file}: cannot read the config file ({reason}); check its permissions") from None


def read_config_stream(stream: BinaryIO, filename: str) -> str:
    """A config's text from a byte stream (a file, standard input), at most MAX_CONFIG_BYTES of it."""
    data = stream.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{filename}: larger than {MAX_CONFIG_MIB} MiB; is this a config file?")
    return decode_utf8(data, filename)


def decode_utf8(data: bytes, filename: str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped); ConfigError naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{filename}: not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}); "
            f"save the file as UTF-8 ({filename}:{line})"
        ) from None


# --------------------------------------------------------------------------- parsing


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops composing past MAX_DEPTH levels or MAX_NODES nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        if self.depth >= MAX_DEPTH:
            raise InputRefused(None, None, TOO_DEEP, mark)
        self.composed += 1
        if self.composed > MAX_NODES:
            raise InputRefused(None, None, TOO_MANY, mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        check_number_length(node)
        value: int = super().construct_yaml_int(node)
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        check_number_length(node)
        value: float = super().construct_yaml_float(node)
        return value


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)


def check_number_length(node: yaml.ScalarNode) -> None:
    """InputRefused for a number written with more than MAX_NUMBER_CHARS characters."""
    if len(node.value) > MAX_NUMBER_CHARS:
        raise InputRefused(None, None, TOO_LONG_NUMBER, node.start_mark)


def parse_yaml_with_lines(text: str, filename: str) -> tuple[dict[str, Any], Lines]:
    """Parse YAML and record the 1-based line of every mapping key and sequence item."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{filename}: larger than {MAX_CONFIG_MIB} MiB; is this a config file?")
    node, data = load_checked(text, filename)
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: expected a mapping of sections such as `sources:` ({filename}:1)")
    lines: Lines = {}
    if node is not None:
        record_lines(node, (), lines)
    return data, lines


def load_checked(text: str, filename: str) -> tuple[yaml.Node | None, Any]:
    """The composed root node and the data built from it, after every bound and key check."""
    loader: BoundedLoader | None = None
    try:
        loader = BoundedLoader(text)  # refuses control characters at once
        node = loader.get_single_node()
        if node is not None:
            check_nodes(node, filename)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(exc, text, filename)) from None
    finally:
        if loader is not None:
            loader.dispose()
    return node, data


def yaml_problem(exc: yaml.YAMLError, text: str, filename: str) -> str:
    """`<yaml>: problem; advice (file:line)` for a parser error or a refused input."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: it knows its offset only
        line = text.count("\n", 0, exc.position) + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        return f"<yaml>: character {character!r} is not allowed in YAML; remove it ({filename}:{line})"
    mark = getattr(exc, "problem_mark", None)
    where = f"{filename}:{mark.line + 1}" if mark else filename
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, InputRefused):
        return f"<yaml>: {problem} ({where})"
    return f"<yaml>: {problem}; fix the YAML syntax ({where})"


# --------------------------------------------------------------------------- checks on the node graph


class NodeCheck:
    """One walk over the composed node graph: expanded size and depth, recursion, and mapping keys.

    A node reached through several aliases is measured once (its size and height are remembered),
    so the walk costs as much as the file, not as much as its expansion.
    """

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.measured: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded size, height)
        self.open: set[int] = set()  # nodes on the current path, to catch recursive aliases
        self.problems: list[str] = []

    def measure(self, node: yaml.Node, path: tuple[Any, ...], depth: int) -> tuple[int, int]:
        """(expanded size, height) of the node; InputRefused when a bound is crossed."""
        key = id(node)
        if key in self.open:
            raise InputRefused(None, None, RECURSIVE, node.start_mark)
        if key not in self.measured:
            self.open.add(key)
            self.measured[key] = self.measure_children(node, path, depth)
            self.open.discard(key)
        size, height = self.measured[key]
        if depth + height - 1 > MAX_DEPTH:
            raise InputRefused(None, None, TOO_DEEP, node.start_mark)
        if size > MAX_NODES:
            raise InputRefused(None, None, TOO_MANY_EXPANDED, node.start_mark)
        return size, height

    def measure_children(self, node: yaml.Node, path: tuple[Any, ...], depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:
            raise InputRefused(None, None, TOO_DEEP, node.start_mark)
        size, height = 1, 0
        for child, child_path in self.children(node, path):
            child_size, child_height = self.measure(child, child_path, depth + 1)
            size, height = size + child_size, max(height, child_height)
        return size, height + 1

    def children(self, node: yaml.Node, path: tuple[Any, ...]) -> list[tuple[yaml.Node, tuple[Any, ...]]]:
        if isinstance(node, yaml.SequenceNode):
            return [(item, (*path, index)) for index, item in enumerate(node.value)]
        if not isinstance(node, yaml.MappingNode):
            return []
        self.check_keys(node, path)
        pairs: list[tuple[yaml.Node, tuple[Any, ...]]] = []
        for key_node, value_node in node.value:
            pairs += [(key_node, path), (value_node, (*path, key_node.value))]
        return pairs

    def check_keys(self, node: yaml.MappingNode, path: tuple[Any, ...]) -> None:
        """Keys must be text, and appear once per mapping."""
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in (STR_TAG, MERGE_TAG):
                self.problems.append(self.key_problem(key_node, path, line))
            elif key_node.value in first_line:
                self.problems.append(
                    f"{dotted((*path, key_node.value))}: duplicate key, already set on line "
                    f"{first_line[key_node.value]}; keep one of them ({self.filename}:{line})"
                )
            else:
                first_line[key_node.value] = line

    def key_problem(self, key_node: yaml.Node, path: tuple[Any, ...], line: int) -> str:
        if isinstance(key_node, yaml.ScalarNode):
            kind = KEY_KINDS.get(key_node.tag, f"of type {key_node.tag.rsplit(':', 1)[-1]}")
            found = f"key {key_node.value!r} is {kind}"
        else:
            found = "a key is a list or mapping"
        return f"{dotted(path)}: {found}, not text; quote it or fix the indentation ({self.filename}:{line})"


def check_nodes(root: yaml.Node, filename: str) -> None:
    """Raise InputRefused past a bound, or ConfigError listing every bad key."""
    check = NodeCheck(filename)
    check.measure(root, (), 1)
    if check.problems:
        raise ConfigError(check.problems)


def record_lines(node: yaml.Node, path: tuple[Any, ...], lines: Lines) -> None:
    """The 1-based line of `node` and of everything under it, by path."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = (*path, key_node.value)
            lines[key_path] = key_node.start_mark.line + 1
            record_lines(value_node, key_path, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            record_lines(item, (*path, index), lines)


def dotted(loc: tuple[Any, ...]) -> str:
    """`sources[2].url` for ("sources", 2, "url"); `<root>` for ()."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<root>"
