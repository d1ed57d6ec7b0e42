"""Config loading: every shipped file validates, errors name the path and line, env overrides apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from multiagenttrainer.config import load_config, parse_config_text
from multiagenttrainer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = ROOT / "configs" / "requests"  # example `mat request` files, not configs
SHIPPED = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if REQUESTS not in p.parents)
SHIPPED_REQUESTS = sorted(REQUESTS.glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_validates(path: Path) -> None:
    load_config(path)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_starts_with_a_comment_naming_a_mat_command(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("#")
    assert "mat " in path.read_text().split("\n\n")[0]


@pytest.mark.parametrize("path", SHIPPED_REQUESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_request_validates_and_names_its_command(path: Path) -> None:
    from multiagenttrainer.request.schema import load_request

    load_request(path)
    assert path.read_text().startswith("# ") and "mat request run" in path.read_text().splitlines()[0]


def test_all_six_source_types_and_their_fields_load() -> None:
    cfg = load_config(ROOT / "configs/examples/sources.yaml")
    assert [s.type for s in cfg.sources] == [
        "local_repo",
        "remote_repo",
        "github_repo",
        "github_org",
        "bedrock_knowledge_base",
        "github_repo_list",
    ]
    org = cfg.sources[3]
    assert org.type == "github_org" and org.max_repos == 50 and org.visibility == "all"


def test_every_problem_is_reported_at_once_with_path_and_line(tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(
        "sources:\n"
        "  - type: local_repo\n"
        "    path: /x\n"
        "    inclde: ['*.py']\n"
        "  - type: remote_repo\n"
        "    branch: main\n"
        "  - type: ftp\n"
        "training:\n"
        "  max_experiments: -1\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    problems = caught.value.problems
    assert (
        f"sources[0].inclde: unknown field; check the spelling against configs/config.example.yaml ({file}:4)"
        in problems
    )
    assert f"sources[1].url: field required ({file}:5)" in problems
    assert any(
        p.startswith("sources[2]: unknown type 'ftp'; valid types: local_repo,") and p.endswith(f"({file}:7)")
        for p in problems
    )
    assert any(p.startswith("training.max_experiments: ") and p.endswith(f"({file}:9)") for p in problems)
    assert len(problems) == 4


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    file = tmp_path / "broken.yaml"
    file.write_text("sources:\n  - type: local_repo\n    path: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    assert f"({file}:" in str(caught.value)


def test_missing_explicit_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.example.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_no_file_in_working_directory_means_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config()
    assert cfg.sources == [] and cfg.training.max_experiments == 10


def test_mat_environment_variables_override_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAT_TRAINING__MAX_EXPERIMENTS", "3")
    monkeypatch.setenv("MAT_CORPUS__DIR", "/tmp/elsewhere")
    cfg = parse_config_text("training:\n  max_experiments: 20\n  output_dir: ./r\n")
    assert cfg.training.max_experiments == 3
    assert cfg.training.output_dir == "./r"
    assert cfg.corpus.dir == "/tmp/elsewhere"


def test_duplicate_machine_names_are_rejected() -> None:
    text = "machines:\n  - name: a\n  - name: a\n"
    with pytest.raises(ConfigError, match=r"machines\[1\]\.name: two machines are named 'a'.* \(.*:3\)"):
        parse_config_text(text)


def test_agent_mode_on_several_machines_is_refused_with_the_alternative() -> None:
    text = "training:\n  mode: agent\nmachines:\n  - name: a\n  - name: b\n"
    with pytest.raises(ConfigError, match=r"training\.mode: agent runs on one machine .* use mode: harness"):
        parse_config_text(text)
    assert parse_config_text("training:\n  mode: agent\nmachines:\n  - name: a\n").machines[0].name == "a"


def test_execution_types_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"training\.execution\.ssh_host: field required"):
        parse_config_text("training:\n  execution:\n    type: ssh\n")


def test_github_urls_default_to_github_com_and_accept_enterprise() -> None:
    assert parse_config_text("{}").github.api_url == "https://api.github.com"
    cfg = parse_config_text(
        "github:\n  web_url: https://ghe.example.com/\n  api_url: https://ghe.example.com/api/v3\n"
    )
    assert cfg.github.web_url == "https://ghe.example.com"
