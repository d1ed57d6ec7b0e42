"""The real `mat` entry point, run as a user would: exit codes, output and files written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest
import yaml

from tests.support.disks import mounted_tmpfs

ROOT = Path(__file__).resolve().parents[2]
MAT = [sys.executable, "-m", "multiagenttrainer.cli"]
MAT_SCRIPT = str(Path(sys.executable).with_name("mat"))  # the console script pip installed
PLANTED_KEY = "AKIA" + "QWERTYUIOPASDFGH"


def mat(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [*MAT, *args], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def write_yaml(path: Path, document: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A plain directory with a few files, one of them holding a planted AWS key."""
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "app.py").write_text("def main():\n    return 42\n")
    (root / "pkg" / "settings.py").write_text(f'AWS_ACCESS_KEY_ID = "{PLANTED_KEY}"\n')
    (root / "README.md").write_text("# Project\nSome words.\n")
    return root


def test_version() -> None:
    result = mat("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == "mat 0.1.0"


def test_config_validate_accepts_the_quickstart() -> None:
    result = mat("config", "validate", "configs/quickstart.yaml")
    assert result.returncode == 0, result.stderr
    assert "configs/quickstart.yaml: valid (1 sources" in result.stdout


def test_config_errors_exit_2_with_path_and_line_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - type: remote_repo\n    brnch: main\ntraining:\n  max_experiments: 0\n")
    result = mat("config", "validate", str(bad))
    assert result.returncode == 2
    assert f"sources[0].url: field required ({bad}:2)" in result.stderr
    assert "sources[0].brnch: unknown field" in result.stderr
    assert f"({bad}:5)" in result.stderr
    assert "Traceback" not in result.stderr


def test_sources_lists_config_and_repo_arguments_as_json(tmp_path: Path, project: Path) -> None:
    cfg = write_yaml(tmp_path / "c.yaml", {"sources": [{"type": "local_repo", "path": str(project)}]})
    result = mat(
        "sources", "--config", str(cfg), "--repo", "acme/widgets", "--repo", "git://h.example/x.git", "--json"
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["name"], r["type"]) for r in rows] == [
        ("project", "local_repo"),
        ("acme/widgets", "github_repo"),
        ("x", "remote_repo"),
    ]
    assert rows[1]["location"].startswith("https://github.com/acme/widgets")


def test_sources_table_has_the_four_columns(tmp_path: Path, project: Path) -> None:
    cfg = write_yaml(
        tmp_path / "c.yaml", {"sources": [{"type": "local_repo", "path": str(project), "name": "mine"}]}
    )
    result = mat("sources", "--config", str(cfg))
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0].split()
    assert header == ["name", "type", "location", "branch"]
    assert "mine" in result.stdout and str(project) in result.stdout


def test_bad_repo_argument_is_a_usage_error(tmp_path: Path) -> None:
    result = mat("sources", "--repo", "not a repo", cwd=tmp_path)
    assert result.returncode == 2
    assert "--repo 'not a repo': expected owner/repo or a git URL" in result.stderr


@pytest.mark.integration
def test_ingest_writes_the_corpus_and_redacts_secrets(
    prefect_api: str, tmp_path: Path, project: Path
) -> None:
    corpus = tmp_path / "corpus"
    cfg = write_yaml(
        tmp_path / "c.yaml",
        {
            "sources": [{"type": "local_repo", "path": str(project)}],
            "corpus": {"dir": str(tmp_path / "unused"), "staging_dir": str(tmp_path / "staging")},
        },
    )
    result = mat("ingest", "--config", str(cfg), "--corpus-dir", str(corpus), "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["files"] == 3
    assert stats == json.loads((corpus / "stats.json").read_text())
    text = (corpus / "corpus.txt").read_text()
    assert "--- source: project | repo: project | path: pkg/app.py ---" in text
    assert PLANTED_KEY not in text
    assert PLANTED_KEY not in (corpus / "corpus.jsonl").read_text()
    assert not (tmp_path / "unused").exists()

    again = mat("ingest", "--config", str(cfg), "--corpus-dir", str(corpus), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["reused"] is True


@pytest.mark.integration
def test_ingest_keeps_good_sources_when_one_fails(prefect_api: str, tmp_path: Path, project: Path) -> None:
    cfg = write_yaml(
        tmp_path / "c.yaml",
        {
            "sources": [
                {"type": "local_repo", "path": str(project), "name": "good"},
                {"type": "local_repo", "path": str(tmp_path / "missing"), "name": "gone"},
            ],
            "corpus": {"dir": str(tmp_path / "corpus"), "staging_dir": str(tmp_path / "staging")},
        },
    )
    result = mat("ingest", "--config", str(cfg))
    assert result.returncode == 1
    assert "failed: gone:" in result.stderr
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert f"Corpus: {tmp_path / 'corpus' / 'corpus.txt'}" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "corpus" / "corpus.jsonl").read_text().splitlines()]
    assert {r["source"] for r in records} == {"good"}


@pytest.mark.integration
def test_ingest_without_sources_says_what_to_do(prefect_api: str, tmp_path: Path) -> None:
    result = mat("ingest", cwd=tmp_path)
    assert result.returncode == 2
    assert "--repo" in result.stderr and "sources" in result.stderr


@pytest.mark.integration
def test_server_status_reports_the_running_server(prefect_api: str) -> None:
    result = mat("server", "status", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["api_url"] == prefect_api and info["healthy"] is True


@pytest.mark.integration
def test_server_start_warns_when_prefect_api_url_wins_over_the_profile(
    prefect_api: str, tmp_path: Path
) -> None:
    env = {
        **os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PREFECT_API_URL": "http://127.0.0.1:9/api",
        "PREFECT_PROFILES_PATH": str(tmp_path / "profiles.toml"),
    }  # fmt: skip
    result = subprocess.run(
        [*MAT, "server", "start"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "was already running" in result.stdout  # the session's server, adopted
    assert "PREFECT_API_URL=http://127.0.0.1:9/api is set here and wins over the profile" in result.stderr
    assert 'PREFECT_API_URL = "' + prefect_api in (tmp_path / "profiles.toml").read_text()


def imported_modules(*args: str) -> set[str]:
    """The modules `mat ARGS` imports (python -X importtime), run from the repository root."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *MAT[1:], *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_status_never_loads_prefect_nor_the_experiment_loop(tmp_path: Path) -> None:
    modules = imported_modules("status", "--output-dir", str(tmp_path))
    assert not {m for m in modules if m == "prefect" or m.startswith("prefect.")}
    assert "multiagenttrainer.experiments.loop" not in modules  # run.json is read, nothing is run


def test_via_deployments_needs_machines_and_says_so_before_starting_anything(tmp_path: Path) -> None:
    config = tmp_path / "mat.yaml"
    config.write_text("training:\n  max_experiments: 2\n")
    result = mat("train", "--via-deployments", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "machines: --via-deployments runs each machine's batch as a flow run" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


@pytest.mark.integration
def test_ingest_on_a_full_disk_says_so_in_one_line(prefect_api: str, tmp_path: Path) -> None:
    source = tmp_path / "big"
    for index in range(60):
        (source / f"d{index % 3}").mkdir(parents=True, exist_ok=True)
        (source / f"d{index % 3}" / f"f{index}.py").write_text(f"value = {index}  # {'y' * 70}\n" * 400)
    with mounted_tmpfs(tmp_path / "disk", size="2m") as disk:
        cfg = write_yaml(
            tmp_path / "c.yaml",
            {
                "sources": [{"type": "local_repo", "path": str(source)}],
                "corpus": {"dir": str(disk / "corpus"), "staging_dir": str(tmp_path / "staging")},
            },
        )
        result = mat("ingest", "--config", str(cfg))
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
        assert f"no space left on the device of {disk / 'corpus'} " in errors[0]
        assert not list((disk / "corpus").glob(".corpus-build-*"))


def raised(action: Callable[[], None]) -> BaseException:
    try:
        action()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


def test_an_interrupt_is_found_behind_what_libraries_make_of_it() -> None:
    from multiagenttrainer.cli import caused_by_interrupt

    def typer_exit() -> None:  # typer: `except KeyboardInterrupt as e: raise Exit(130) from e`, then sys.exit
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("Exit(130)") from exc
        except RuntimeError:
            sys.exit(130)

    def wrapped() -> None:  # a library turning it into an error of its own, while handling it
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ValueError("Error calling function: KeyboardInterrupt")  # noqa: B904

    def reported() -> None:  # a command that said so itself: `raise typer.Exit(130) from None`
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemExit(130) from None

    assert caused_by_interrupt(raised(typer_exit))
    assert caused_by_interrupt(raised(wrapped))
    assert not caused_by_interrupt(raised(reported))
    assert not caused_by_interrupt(raised(lambda: sys.exit(1)))


@pytest.mark.integration
def test_ctrl_c_anywhere_in_an_ingest_is_one_line_and_exit_130(
    prefect_api: str, project: Path, tmp_path: Path
) -> None:
    """Ctrl-C while the `mat` script loads, starts Prefect, runs the flow or builds: never a traceback."""
    cfg = write_yaml(tmp_path / "c.yaml", {"sources": [{"type": "local_repo", "path": str(project)}]})
    env = {**os.environ, "NO_COLOR": "1"}
    for delay in (0.1, 0.3, 0.6, 0.9, 1.2, 1.5, 2.0):
        process = subprocess.Popen(
            [MAT_SCRIPT, "ingest", "--config", str(cfg), "--corpus-dir", str(tmp_path / f"corpus-{delay}")],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        time.sleep(delay)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = process.communicate(timeout=60)
        assert "Traceback" not in err, (delay, err)
        assert process.returncode in (0, 130), (delay, process.returncode, err)
        if process.returncode == 130:
            assert err.strip().splitlines() == [
                "interrupted; run the command again to go on (what was finished is kept)"
            ], (delay, err)
