"""A workspace set up from the fixture autoresearch repository holds exactly what its prepare.py reads.

One set-up (module scope) over a run directory that starts with a default cache's leftovers: ClimbMix-like
shards, a half-written download and a stale tokenizer. The tests then read the result back the way
autoresearch does: parquet `text` rows, the pinned val file, the tokenizer files and a real training run.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from multiagenttrainer.workspace.autoresearch import AutoresearchSetup, disable_downloads, read_constants
from multiagenttrainer.workspace.summary import parse_run_summary
from tests.support.git_servers import GitHttpServer, git
from tests.workspace.autoresearch.conftest import ASSET_DIR, BRANCH_MARKER, PublishedRepo, set_up

pytestmark = pytest.mark.integration

VAL_FILENAME = "shard_06542.parquet"
HEADER = re.compile(r"^### (?P<label>\S+)(?: \(part (?P<part>\d+)/(?P<parts>\d+)\))?\n")
TRAIN_TIMEOUT_S = 120


@dataclass
class Prepared:
    setup: AutoresearchSetup
    run_dir: Path
    workspace: Path
    started: float


def read_rows(path: Path) -> list[str]:
    """The `text` column of a parquet file, as autoresearch's loader reads it."""
    rows: list[str] = pq.read_table(path).column("text").to_pylist()
    return rows


def records(corpus: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in corpus.read_bytes().splitlines() if line.strip()]


def modified_files(workspace: Path) -> set[str]:
    """Paths `git status` reports as changed or untracked in the workspace."""
    return {line.split()[-1] for line in git("status", "--porcelain", cwd=workspace).splitlines()}


def label_of(row: str) -> str:
    match = HEADER.match(row)
    assert match, f"row does not start with a header line: {row[:80]!r}"
    return match.group("label")


def plant_default_cache(cache: Path) -> None:
    """What a default ~/.cache/autoresearch holds: ClimbMix shards, a .tmp download, a stale tokenizer."""
    data, tokenizer = cache / "data", cache / "tokenizer"
    data.mkdir(parents=True)
    tokenizer.mkdir()
    leftover = pa.table({"text": ["CLIMBMIX LEFTOVER document"] * 3})
    for name in ("shard_00000.parquet", "shard_00007.parquet", VAL_FILENAME):
        pq.write_table(leftover, data / name)
    (data / "shard_00008.parquet.tmp").write_bytes(b"half a download")
    for name in ("tokenizer.pkl", "token_bytes.pt"):
        (tokenizer / name).write_bytes(b"stale")
        os.utime(tokenizer / name, (time.time() - 3600, time.time() - 3600))


@pytest.fixture(scope="module")
def prepared(
    fake_autoresearch: PublishedRepo, mat_corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Prepared:
    run_dir = tmp_path_factory.mktemp("run")
    plant_default_cache(run_dir / "cache" / "autoresearch")
    started = time.time()
    setup = set_up(str(fake_autoresearch.work), mat_corpus, run_dir, train_time=42)
    return Prepared(setup, run_dir, run_dir / "workspace", started)


def data_dir(prepared: Prepared) -> Path:
    return prepared.run_dir.resolve() / "cache" / "autoresearch" / "data"


# ---------------------------------------------------------------- the workspace


def test_workspace_is_the_repository_at_the_branch(
    prepared: Prepared, fake_autoresearch: PublishedRepo
) -> None:
    assert git("rev-parse", "HEAD", cwd=prepared.workspace) == fake_autoresearch.head("master")
    assert prepared.setup.commit == fake_autoresearch.head("master")
    assert prepared.setup.branch == "master"
    assert (prepared.workspace / BRANCH_MARKER).read_text() == "master\n"
    # Only the set-up's own edits are pending; the caller commits them as the baseline.
    assert modified_files(prepared.workspace) == {"prepare.py", "program.md"}
    assert prepared.setup.changed_files == ["prepare.py", "program.md"]


def test_cache_dir_and_time_budget_are_rewritten_and_nothing_else(prepared: Prepared) -> None:
    source = (prepared.workspace / "prepare.py").read_text()
    constants = read_constants(source)
    cache = prepared.run_dir.resolve() / "cache" / "autoresearch"
    assert constants["CACHE_DIR"] == str(cache) == prepared.setup.cache_dir
    assert constants["DATA_DIR"] == str(cache / "data") == prepared.setup.data_dir
    assert constants["TIME_BUDGET"] == 42
    original, _ = disable_downloads((ASSET_DIR / "prepare.py").read_text())  # tested below
    changed = [new for old, new in zip(original.splitlines(), source.splitlines(), strict=True) if old != new]
    assert [line.split(" = ")[0] for line in changed] == ["TIME_BUDGET", "CACHE_DIR"]
    assert "expanduser" not in changed[1]


def test_downloads_are_disabled_and_the_data_left_alone(prepared: Prepared) -> None:
    """Running prepare.py as autoresearch's program.md says (it downloads shards) fails with the reason."""
    source = (prepared.workspace / "prepare.py").read_text()
    assert "def download_single_shard(*args, **kwargs):\n    raise RuntimeError(" in source
    assert "def download_data(*args, **kwargs):\n    raise RuntimeError(" in source
    assert (
        "downloads disabled in prepare.py (download_data, download_single_shard raise)"
        in prepared.setup.notes
    )
    before = sorted(path.name for path in data_dir(prepared).iterdir())
    done = subprocess.run(
        [*prepared.setup.python, "prepare.py", "--num-shards", "3"],
        cwd=prepared.workspace,
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S,
    )
    assert done.returncode != 0
    assert "RuntimeError: downloads are disabled in this workspace by mat" in done.stderr
    assert sorted(path.name for path in data_dir(prepared).iterdir()) == before


def test_program_md_describes_the_workspace_as_it_is(prepared: Prepared) -> None:
    program = (prepared.workspace / "program.md").read_text()
    setup = prepared.setup
    assert f"`{setup.data_dir}` holds 1 training shard(s)" in program
    assert f"`{setup.tokenizer_dir}` (`tokenizer.pkl`, `token_bytes.pt`)" in program
    assert "`TIME_BUDGET = 42` seconds of training per run" in program
    assert (
        f"The command mat runs, in this directory: `{shlex.join(setup.train_command)} > run.log 2>&1`"
        in program
    )
    assert f"commit {setup.commit[:12]}" in program
    original = (ASSET_DIR / "program.md").read_text()
    for stale in ("uv run prepare.py", "5 minutes", "uv run train.py"):
        assert stale in original and stale not in program


# ---------------------------------------------------------------- the shards


def test_only_our_shards_are_left_in_the_data_dir(prepared: Prepared) -> None:
    names = sorted(path.name for path in data_dir(prepared).iterdir())
    assert names == ["shard_00000.parquet", VAL_FILENAME]
    assert prepared.setup.train_shards == 1
    for name in names:
        assert not any("CLIMBMIX" in row for row in read_rows(data_dir(prepared) / name))


def test_shards_have_a_single_text_column(prepared: Prepared) -> None:
    for path in data_dir(prepared).iterdir():
        schema = pq.read_schema(path)
        assert schema.names == ["text"]
        assert pa.types.is_string(schema.field("text").type) or pa.types.is_large_string(
            schema.field("text").type
        )


def test_rows_fit_the_sequence_length_and_repeat_the_file_header(
    prepared: Prepared, mat_corpus: Path
) -> None:
    assert prepared.setup.max_seq_len == 256  # read from the fixture's prepare.py
    assert prepared.setup.chunk_chars == 256 * 3
    parts: dict[str, dict[int, str]] = defaultdict(dict)
    for path in data_dir(prepared).iterdir():
        for row in read_rows(path):
            assert len(row) <= prepared.setup.chunk_chars
            match = HEADER.match(row)
            assert match, row[:80]
            parts[match.group("label")][int(match.group("part") or 1)] = row[match.end() :]
    texts = {f"{r['repo']}/{r['path']}": r["text"] for r in records(mat_corpus)}
    split_files = [label for label, pieces in parts.items() if len(pieces) > 1]
    assert split_files, "the corpus should hold files longer than one chunk"
    for label, pieces in parts.items():
        assert sorted(pieces) == list(range(1, len(pieces) + 1))
        assert "".join(pieces[n] for n in sorted(pieces)) == texts[label]  # nothing lost, nothing added
        if label != "acme/mat/generated/table.py":  # its lines are longer than a row: they are cut
            assert all(pieces[n].endswith("\n") for n in sorted(pieces)[:-1])  # cut on line boundaries


COUNT_ROWS = """\
import json, sys
import pyarrow.parquet as pq
from prepare import Tokenizer
tokenizer = Tokenizer.from_directory()
rows = [row for path in sys.argv[1:] for row in pq.read_table(path).column("text").to_pylist()]
print(json.dumps([len(ids) for ids in tokenizer.encode(rows, prepend=tokenizer.get_bos_token_id())]))
"""


def test_every_row_fits_one_packed_row_as_the_trained_tokenizer_counts_it(prepared: Prepared) -> None:
    """The fixture's tokenizer averages under 3 characters per token, so rows cut at 3 characters per
    token would be too long; counted with the tokenizer, none is (BOS + text <= MAX_SEQ_LEN + 1)."""
    shards = sorted(str(path) for path in data_dir(prepared).iterdir())
    done = subprocess.run(
        [*prepared.setup.python, "-c", COUNT_ROWS, *shards],
        cwd=prepared.workspace,
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lengths = json.loads(done.stdout)
    assert max(lengths) <= 256 + 1
    assert prepared.setup.recut_documents > 0 and prepared.setup.rows_over_limit == 0
    assert any("were cut finer" in note for note in prepared.setup.notes)
    train_rows = sum(len(read_rows(Path(path))) for path in shards if not path.endswith(VAL_FILENAME))
    assert train_rows == prepared.setup.train_chunks
    assert prepared.setup.train_tokens == sum(lengths) - lengths_of_val(prepared, lengths, shards)
    assert prepared.setup.tokens_per_step == 8 * 256  # the fixture's DEVICE_BATCH_SIZE x MAX_SEQ_LEN


def lengths_of_val(prepared: Prepared, lengths: list[int], shards: list[str]) -> int:
    """The summed lengths of the val shard's rows, which come last in `lengths` (its name sorts last)."""
    assert shards[-1].endswith(VAL_FILENAME)
    return sum(lengths[-len(read_rows(Path(shards[-1]))) :])


def test_val_documents_are_only_in_the_val_shard(prepared: Prepared, mat_corpus: Path) -> None:
    corpus = records(mat_corpus)
    val_labels = {f"{r['repo']}/{r['path']}" for r in corpus if r["split"] == "val"}
    train_labels = {f"{r['repo']}/{r['path']}" for r in corpus if r["split"] == "train"}
    val_rows = read_rows(data_dir(prepared) / VAL_FILENAME)
    train_rows = read_rows(data_dir(prepared) / "shard_00000.parquet")
    assert {label_of(row) for row in val_rows} == val_labels
    assert {label_of(row) for row in train_rows} == train_labels
    assert (prepared.setup.val_documents, prepared.setup.train_documents) == (
        len(val_labels),
        len(train_labels),
    )
    assert (prepared.setup.val_chunks, prepared.setup.train_chunks) == (len(val_rows), len(train_rows))
    assert prepared.setup.val_carved_documents == 0


# ---------------------------------------------------------------- tokenizer and training


def test_tokenizer_is_retrained_for_this_corpus(prepared: Prepared) -> None:
    tokenizer_dir = Path(prepared.setup.tokenizer_dir)
    for name in ("tokenizer.pkl", "token_bytes.pt"):
        assert (tokenizer_dir / name).stat().st_mtime >= prepared.started
        assert (tokenizer_dir / name).read_bytes() != b"stale"
    with (tokenizer_dir / "tokenizer.pkl").open("rb") as handle:
        assert len(pickle.load(handle)["merges"]) > 0
    log = (prepared.run_dir / "logs" / "prepare.log").read_text()
    assert "Tokenizer: sanity check passed" in log
    assert prepared.setup.tokenizer_seconds > 0


def test_baseline_training_run_prints_a_parseable_summary(prepared: Prepared, tmp_path: Path) -> None:
    home = tmp_path / "home"  # an empty HOME: the run must not need ~/.cache/autoresearch
    home.mkdir()
    env = {
        **os.environ,
        **prepared.setup.env,
        "HOME": str(home),
        "MAT_FIXED_STEPS": "3",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        prepared.setup.train_command,
        cwd=prepared.workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = parse_run_summary(done.stdout)
    assert summary is not None, done.stdout[-2000:]
    assert summary["num_steps"] == 3
    assert 0 < summary["val_bpb"] < 20
    assert list(home.iterdir()) == []


def test_setup_describes_how_to_train(prepared: Prepared) -> None:
    # The fixture is not a uv project, so mat's own interpreter runs it; the note says so.
    assert prepared.setup.train_command == [sys.executable, "train.py"]
    assert any("not a uv project" in note for note in prepared.setup.notes)
    assert json.loads(json.dumps(prepared.setup.to_dict()))["train_shards"] == 1


# ---------------------------------------------------------------- two runs, other transports, program.md


def test_concurrent_runs_with_different_corpora_keep_separate_caches(
    fake_autoresearch: PublishedRepo,
    served_http: GitHttpServer,
    mat_corpus: Path,
    tests_corpus_without_val: Path,
    tmp_path: Path,
) -> None:
    program = tmp_path / "program.md"
    program.write_text("# Our own program\nEdit train.py only.\n")
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(set_up, f"file://{fake_autoresearch.bare}", mat_corpus, tmp_path / "a")
        second = pool.submit(
            set_up,
            f"{served_http.url}/karpathy/autoresearch.git",
            tests_corpus_without_val,
            tmp_path / "b",
            branch="cpu",
            program_md=str(program),
        )
        a, b = first.result(), second.result()

    assert a.cache_dir != b.cache_dir
    for setup, run, owner in ((a, "a", "acme/mat/"), (b, "b", "acme/tests/")):
        prepare = (tmp_path / run / "workspace" / "prepare.py").read_text()
        assert (
            read_constants(prepare)["CACHE_DIR"]
            == setup.cache_dir
            == str((tmp_path / run).resolve() / "cache/autoresearch")
        )
        for path in Path(setup.data_dir).iterdir():
            assert all(label_of(row).startswith(owner) for row in read_rows(path))
    tokenizers = [(Path(s.tokenizer_dir) / "tokenizer.pkl").read_bytes() for s in (a, b)]
    assert tokenizers[0] != tokenizers[1]

    # The second run: branch cpu over HTTP, program.md replaced, val carved from a train-only corpus.
    assert (tmp_path / "b" / "workspace" / BRANCH_MARKER).read_text() == "cpu\n"
    assert (tmp_path / "b" / "workspace" / "program.md").read_text() == program.read_text()
    assert b.changed_files == ["prepare.py", "program.md"]
    assert modified_files(tmp_path / "b" / "workspace") == {"prepare.py", "program.md"}
    assert b.val_carved_documents > 0 and b.val_documents == b.val_carved_documents
    assert any("no val split" in note for note in b.notes)
    val_labels = {label_of(row) for row in read_rows(Path(b.data_dir) / VAL_FILENAME)}
    train_labels = {label_of(row) for row in read_rows(Path(b.data_dir) / "shard_00000.parquet")}
    assert val_labels and train_labels and not val_labels & train_labels
