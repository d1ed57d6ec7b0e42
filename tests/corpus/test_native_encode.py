"""The native encoder (C) against the Python rules it accelerates: it may only decide plain text files,
must escape exactly as orjson does, and a corpus built with it is byte-identical to one built without it."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multiagenttrainer.corpus import accel
from multiagenttrainer.corpus.chunks import git_blob_sha
from multiagenttrainer.corpus.filters import (
    GENERATED_MARKERS,
    LONG_LINE_CHARS,
    content_skip_reason,
    decode_text,
)
from tests.corpus.conftest import dir_snapshot, write_tree

LIMIT = 1 << 20
VOLATILE = ("build_seconds", "created_at", "paths", "native", "workers")


@pytest.fixture(scope="module")
def native() -> ModuleType:
    module = accel.encoder()
    assert module is not None, "the native encoder is not built: run `make native` (needs gcc and libssl-dev)"
    return module


# Text that reaches every branch: JSON specials, controls, non-ASCII of every UTF-8 length, long lines.
PIECES = st.sampled_from(
    ['"', "\\", "\n", "\r\n", "\t", "\x00", "\x01", "\x1f", "\x7f", "é", "漢", "😀", "\u2028", "/", " "]
)
TEXT = st.lists(st.one_of(st.text(max_size=40), PIECES, st.just("x" * 17)), max_size=60).map("".join)


@given(TEXT)
@settings(max_examples=400, deadline=None)
def test_escape_matches_orjson_for_any_text(native: ModuleType, text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    try:
        expected = orjson.dumps(data.decode("utf-8"))[1:-1]
    except UnicodeDecodeError:  # lone surrogates are not UTF-8
        assert native.escape(data) is None
        return
    assert native.escape(data) == expected


INVALID = st.sampled_from(
    [b"\xff", b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3", b"\xe6", b"\x80"]
)


@given(st.lists(st.one_of(st.binary(max_size=20), INVALID, st.just(b"ok\n")), max_size=20).map(b"".join))
@settings(max_examples=400, deadline=None)
def test_escape_accepts_exactly_what_python_decodes_strictly(native: ModuleType, data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert native.escape(data) is None
    else:
        assert native.escape(data) == orjson.dumps(text)[1:-1]


LINES = st.one_of(
    TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([m.upper() for m in GENERATED_MARKERS] + list(GENERATED_MARKERS)),
    st.sampled_from([b"\x00", b"\xff\xfe", b"x" * (LONG_LINE_CHARS + 1), b"\n" * 7, b"y" * 2100]),
    st.binary(max_size=30),
)


@given(st.lists(LINES, max_size=12).map(b"".join), st.booleans())
@settings(max_examples=500, deadline=None)
def test_encode_decides_only_what_the_python_rules_keep_unchanged(
    native: ModuleType, data: bytes, skip_generated: bool
) -> None:
    plain, escaped, sha = native.encode(data, LIMIT, skip_generated)
    reason = content_skip_reason(data, "module.py", LIMIT, skip_generated)
    if plain:
        assert reason is None
        assert decode_text(data) == (data.decode("utf-8"), False)
        assert escaped == orjson.dumps(data.decode("utf-8"))[1:-1]
        assert sha == git_blob_sha(data)
    else:
        assert escaped is None and sha is None
    if reason is not None:
        assert not plain


def test_encode_leaves_prose_with_few_newlines_to_python(native: ModuleType) -> None:
    """The mean-line rule exempts prose by file name, which the encoder does not see."""
    paragraph = b"word " * 500 + b"\n"
    assert native.encode(paragraph, LIMIT, True)[0] is False
    assert content_skip_reason(paragraph, "README.md", LIMIT, True) is None
    assert content_skip_reason(paragraph, "bundle.js", LIMIT, True) == "minified"


def test_read_file_reads_at_most_one_byte_past_the_limit(native: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"a" * 100)
    assert native.read_file(str(path), 100, 1000) == b"a" * 100
    assert native.read_file(str(path), 10, 1000) == b"a" * 100  # grew since it was listed
    assert native.read_file(str(path), 100, 50) == b"a" * 51
    with pytest.raises(FileNotFoundError):
        native.read_file(str(tmp_path / "gone.txt"), 1, 10)


TRICKY_FILES: dict[str, str | bytes] = {
    "src/app.py": 'def main():\n    print("hi\\tthere")\n',
    "src/quotes.js": 'const s = "a \\"quoted\\" \\\\ path";\r\nconsole.log(s)\r\n',
    "src/copy_of_app.py": 'def main():\n    print("hi\\tthere")\n',  # duplicate
    "src/controls.txt": "bell \x07 escape \x1b form \x0c del \x7f\n",
    "src/unicode_名前.py": "名前 = 'värde' + '😀'\n",
    "src/line\u2028sep.md": "text with \u2028 and \u2029\n",
    "src/no_newline.go": "package main",
    "src/empty.py": "",
    "src/binary.dat": b"\x89PNG\r\n\x1a\n\x00\x00\x00" + bytes(range(256)),
    "src/latin1.py": b"# caf\xe9\n" + b"x = 1\n" * 200,  # under 1 % invalid: kept with U+FFFD
    "src/garbage.py": bytes(range(128, 256)) * 4,  # mostly invalid: left out
    "src/gen.py": "# Code generated by protoc. DO NOT EDIT.\nx = 1\n",
    "src/long.js": "var a = '" + "x" * 6000 + "';\n",
    "src/few_newlines.js": "f(" + "1, " * 1000 + ")\n",
    "docs/paragraph.md": "word " * 1000 + "\n",
    "config/settings.py": 'AWS_ACCESS_KEY_ID = "AKIAIOSFODNN7ABCDEFG"\npassword = "hunter2-real-secret"\n',
    "config/token.env": "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789\n",
    "config/clean.py": "token = get_token()\nsecret_name = 'prod/db'\n",
    "config/db.yaml": "url: postgres://admin:s3cr3tPass9@db.internal/app\n",
    "docs/links.md": "See https://example.com/a and https://example.org/b, or mail me@example.com.\n",
    "docs/more_links.md": "See https://example.com/a and git://example.org/b.git\n",
    "big/huge.txt": "y = 1\n" * 2000,
}


def build_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, **options: Any
) -> list[Path]:
    from multiagenttrainer.config import CorpusConfig
    from multiagenttrainer.corpus import build_corpus

    root = write_tree(tmp_path / "tree", TRICKY_FILES)
    outputs = []
    for setting in ("1", "0"):
        monkeypatch.setenv(accel.DISABLE_VARIABLE, setting)
        out = tmp_path / f"out-native-{setting}"
        stats = build_corpus(
            [dir_snapshot(root, source="mine", commit="c0ffee")],
            CorpusConfig(**options),
            out / "corpus.txt",
            workers=workers,
            chunk_bytes=512,
        )
        assert stats["native"] is (setting == "1")
        (out / "stats.cmp").write_bytes(
            orjson.dumps({k: v for k, v in stats.items() if k not in VOLATILE}, option=orjson.OPT_SORT_KEYS)
        )
        outputs.append(out)
    return outputs


@pytest.mark.parametrize("workers", [0, 2])
def test_corpus_is_byte_identical_with_and_without_the_native_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    with_native, without = build_both_ways(tmp_path, monkeypatch, workers, max_file_bytes=10_000)
    for name in ("corpus.txt", "corpus.jsonl", "stats.cmp"):
        assert (with_native / name).read_bytes() == (without / name).read_bytes(), name
    stats = orjson.loads((with_native / "stats.cmp").read_bytes())
    assert stats["skipped"] == {
        "binary": 1,
        "duplicate": 1,
        "empty": 1,
        "generated": 1,
        "minified": 2,
        "too_large": 1,
        "undecodable": 1,
    }
    assert stats["replaced_encoding"] == 1
    assert stats["secrets_by_rule"] == {
        "aws-access-key": 1,
        "github-token": 1,
        "secret-assignment": 1,
        "url-credentials": 1,
    }
    text = (with_native / "corpus.txt").read_text()
    assert "AKIAIOSFODNN7ABCDEFG" not in text and "hunter2-real-secret" not in text and "ghp_" not in text
    assert "s3cr3tPass9" not in text and "postgres://admin:<REDACTED:url-credentials>@db.internal" in text
    assert "https://example.com/a and https://example.org/b, or mail me@example.com." in text
    assert "path: docs/paragraph.md" in text  # prose keeps its long lines


def test_options_apply_the_same_way_natively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_native, without = build_both_ways(
        tmp_path, monkeypatch, 0, dedupe=False, redact_secrets=False, skip_generated=False, val_fraction=0.5
    )
    for name in ("corpus.txt", "corpus.jsonl", "stats.cmp"):
        assert (with_native / name).read_bytes() == (without / name).read_bytes(), name
    assert b"hunter2-real-secret" in (with_native / "corpus.txt").read_bytes()


@pytest.mark.parametrize(("fraction", "splits"), [(0.0, {"train"}), (0.999999, {"val"})])
def test_the_split_edges_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fraction: float, splits: set[str]
) -> None:
    with_native, without = build_both_ways(tmp_path, monkeypatch, 0, val_fraction=fraction)
    assert (with_native / "corpus.jsonl").read_bytes() == (without / "corpus.jsonl").read_bytes()
    records = [orjson.loads(line) for line in (with_native / "corpus.jsonl").read_bytes().splitlines()]
    assert records and {r["split"] for r in records} == splits


def test_a_file_that_vanishes_before_the_build_is_counted_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multiagenttrainer.config import CorpusConfig
    from multiagenttrainer.corpus import build_corpus
    from multiagenttrainer.corpus.walk import list_directory

    root = write_tree(tmp_path / "tree", {"a.py": "a = 1\n", "b.py": "b = 2\n"})
    listing = list_directory(root)  # the build replays this listing, which still names b.py
    os.unlink(root / "b.py")
    monkeypatch.setenv(accel.DISABLE_VARIABLE, "1")
    stats = build_corpus(
        [dir_snapshot(root, version=listing.fingerprint)], CorpusConfig(), tmp_path / "out" / "corpus.txt"
    )
    assert stats["files"] == 1 and stats["skipped"] == {"unreadable": 1}
