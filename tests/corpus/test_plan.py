"""The per-file planning of a directory tree's span: the native loop gives the Python loop's answer."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multiagenttrainer.corpus.filters import (
    GENERATED_NAME,
    LOCK_FILES,
    MINIFIED_NAME,
    NAME_HINTS,
    NAME_RULES,
    name_skip_reason,
)
from multiagenttrainer.corpus.ignore import PathSelector
from multiagenttrainer.corpus.plan import FileSpan, ListOptions, plan_files, plan_files_python
from multiagenttrainer.corpus.walk import WalkEvent
from tests.corpus.conftest import native_code

LIMIT = 100
ascii_names = st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)
rule_names = st.one_of(st.from_regex(GENERATED_NAME), st.from_regex(MINIFIED_NAME)).filter(str.isascii)
names = st.one_of(
    ascii_names,
    rule_names.map(lambda name: name.replace("/", "_")),
    st.sampled_from(sorted(LOCK_FILES)),
    st.sampled_from(["a.pb.go", "x_pb2.py", "m.min.js", "site.css.map", "s_string.go", "k.generated.ts"]),
    st.sampled_from(
        ["caf\u00e9.py", "\u20ac.min.js", "bad\udcff.txt", "new\nline.py", "cr\r.py", "q\u00e9_pb2.py"]
    ),
)
rels = st.lists(names, min_size=1, max_size=3).map("/".join)
events = st.lists(
    st.tuples(
        st.sampled_from(["file", "file", "file", "dir", "skip"]),
        rels,
        st.sampled_from([0, 1, LIMIT, LIMIT + 1]),
    ),
    max_size=40,
).map(lambda rows: [WalkEvent(kind, rel, "/t/" + rel, size, 7) for kind, rel, size in rows])
selectors = st.sampled_from(
    [
        PathSelector.from_lists([], []),
        PathSelector.from_lists([["*.py", "*.js"]], []),
        PathSelector.from_lists([], [["a*"]]),
    ]
)


def planned(span: FileSpan, native: bool) -> tuple[list[object], int, list[tuple[str, bool]]]:
    skips: list[tuple[str, bool]] = []
    with native_code(native):
        plan = plan_files if native else plan_files_python
        items, files = plan(span, lambda reason, is_dir: skips.append((reason, is_dir)))
    return list(items), files, skips


@given(events, st.data(), st.booleans(), selectors)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_native_planner_gives_the_python_planners_answer(
    listed: list[WalkEvent], data: st.DataObject, skip_generated: bool, selector: PathSelector
) -> None:
    start = data.draw(st.integers(0, len(listed)))
    stop = data.draw(st.integers(start, len(listed)))
    cuts = sorted(data.draw(st.lists(st.integers(start, stop), max_size=4, unique=True)))
    pruned = tuple((low, high) for low, high in zip(cuts[::2], cuts[1::2], strict=False) if low < high)
    options = ListOptions(skip_vendored=True, skip_generated=skip_generated, max_file_bytes=LIMIT)
    span = FileSpan(3, listed, start, stop, pruned, options, selector)
    native = planned(span, True)
    assert native == planned(span, False)
    assert all(type(item).__name__ == "Item" for item in native[0])


@given(st.one_of(st.from_regex(NAME_RULES), rule_names))
@settings(max_examples=500, deadline=None)
def test_every_ascii_name_the_name_rules_match_holds_a_hint(name: str) -> None:
    """The native planner asks name_skip_reason only about ASCII names holding a hint (or lock files)."""
    if name.isascii() and NAME_RULES.search(name):
        assert any(hint.decode() in name for hint in NAME_HINTS), name


def test_names_without_a_hint_pass_the_name_rules() -> None:
    for name in ("main.py", "index.js", "README.md", "pbx.c", "g.dart", "minimal.css", "map.js"):
        assert not any(hint.decode() in name for hint in NAME_HINTS)
        assert name_skip_reason(name, True) is None
