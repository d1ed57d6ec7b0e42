"""Two ingests of one corpus directory never interleave their writes: the second waits, saying so, or gives
up with a clear error after its wait."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from multiagenttrainer.errors import CorpusError
from multiagenttrainer.ingest import LOCK_FILE, corpus_lock
from tests.flows.conftest import write_config
from tests.support.prefect_runs import MAT, ROOT, session_env

HOLDER = """
import sys, time
from pathlib import Path
from multiagenttrainer.ingest import corpus_lock
with corpus_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
print("released", flush=True)
"""


@contextmanager
def lock_held_by_another_process(corpus_dir: Path, release: Path) -> Iterator[subprocess.Popen[str]]:
    """A second process holding the corpus directory's lock until `release` exists."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(corpus_dir), str(release)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        release.touch()
        holder.wait(timeout=30)


def test_an_ingest_waits_with_a_message_until_the_other_one_is_done(prefect_api: str, tmp_path: Path) -> None:
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.md").write_text("# A\nLOCKED_NOTE\n")
    config = write_config(
        tmp_path / "mat.yaml",
        [{"type": "local_repo", "path": str(source), "name": "notes"}],
        tmp_path / "corpus",
        tmp_path / "staging",
    )
    release, log = tmp_path / "release", tmp_path / "ingest.log"
    with lock_held_by_another_process(tmp_path / "corpus", release) as holder:
        with log.open("wb") as handle:
            ingest = subprocess.Popen(
                [*MAT, "ingest", "--config", str(config)], cwd=ROOT, env=session_env(),
                stdout=handle, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while "waiting for it to finish" not in log.read_text():
            assert ingest.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert f"another ingest (pid {holder.pid} on " in log.read_text()
        time.sleep(1.0)
        assert ingest.poll() is None and not (tmp_path / "corpus" / "corpus.txt").exists()  # still waiting
        released_at = time.monotonic()
    assert ingest.wait(timeout=240) == 0, log.read_text()
    assert time.monotonic() >= released_at
    assert "LOCKED_NOTE" in (tmp_path / "corpus" / "corpus.txt").read_text()
    assert (tmp_path / "corpus" / LOCK_FILE).is_file()


def test_an_ingest_gives_up_after_its_wait_naming_the_other_one(tmp_path: Path) -> None:
    corpus_dir = tmp_path / "corpus"
    with lock_held_by_another_process(corpus_dir, tmp_path / "release") as holder:
        started = time.monotonic()
        with (
            pytest.raises(
                CorpusError,
                match=rf"{corpus_dir} is still being written by another ingest \(pid {holder.pid} on",
            ),
            corpus_lock(corpus_dir, wait_s=0.5),
        ):
            pass
        assert time.monotonic() - started < 10
    with corpus_lock(corpus_dir, wait_s=0.5):  # free again once the other one is done
        pass
