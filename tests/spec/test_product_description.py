"""The product description (spec/product-readme.txt), example by example, against the real `mat`.

Its examples are copied under tests/spec/examples/ as written. Every YAML example goes through
`mat config validate`; every command line runs as typed against local stand-ins (conftest.py: a git
host for github.com, a fake GitHub API and Bedrock endpoint, moto for Bedrock fine-tuning, the
session's Prefect server); the Library Usage snippet runs through the library API; every field of the
description's tables exists with the same name, and the values it shows as defaults are the defaults.

What is adapted, and why, is said where it happens: hosts and paths point at the stand-ins, the Hub
model ids at a tiny local model (there is no network), and QLoRA, which needs CUDA, is expected to be
refused on a CPU machine. What cannot work as written is listed in NOT_AS_WRITTEN.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import boto3
import pytest
import yaml

from multiagenttrainer.config import (
    AutoresearchConfig,
    BedrockConfig,
    BedrockKnowledgeBaseSource,
    Config,
    DockerExecution,
    FinetunerConfig,
    FineTuneTarget,
    GithubOrgSource,
    GithubRepoListSource,
    GithubRepoSource,
    LocalRepoSource,
    MachineConfig,
    NotificationsConfig,
    OpenSourceConfig,
    RemoteRepoSource,
    SesConfig,
    SshExecution,
    TrainingConfig,
)
from multiagenttrainer.finetune import FineTuner
from tests.spec.conftest import EXAMPLES, ROOT, StandIns, example, run_mat
from tests.support.aws import moto_server

YAML_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))

# What the description shows that cannot work as written, and where the real contract is tested.
NOT_AS_WRITTEN = {
    "ruff check src/ tests/": "there is no src/: the package is multiagenttrainer/ (make lint checks it)",
    "ruff format src/ tests/": "there is no src/: the package is multiagenttrainer/",
    "Adding a new backend": "the snippet edits finetuner/registry.py with an if-chain and builds the backend "
    "as (cfg.anthropic, jobs_dir, console); mat's backends are registered with register_backend() from "
    "a plugin and built as (section, store, target): README 'Adding a backend', "
    "tests/finetune/test_plugin_backend.py",
    "docker compose run --rm mat ...": "needs the postgres and prefecthq/prefect images from a registry, "
    "which this machine cannot reach: tests/docker_image builds mat's image offline and trains in it, "
    "and checks docker-compose.yml with `docker-compose config`",
}


# ---------------------------------------------------------------- every YAML example validates


@pytest.mark.parametrize("name", YAML_EXAMPLES)
def test_every_yaml_example_validates_as_written(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(example(name), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "multiagenttrainer.cli", "config", "validate", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{path}: valid (")


# ---------------------------------------------------------------- every field of the tables


SECTION_TABLE = {  # Top-level sections: section -> the fields its description names
    "autoresearch": {"repo", "branch", "train_time", "program_md"},
    "sources": set(),
    "training": {"agent_command", "max_experiments", "output_dir", "execution"},
    "machines": set(),
    "notifications": {"ses"},
    "finetuner": {"backend", "jobs_dir", "opensource", "bedrock", "targets"},
}
SECTION_MODELS = {"autoresearch": AutoresearchConfig, "training": TrainingConfig,
                  "notifications": NotificationsConfig, "finetuner": FinetunerConfig}  # fmt: skip

SOURCE_TYPES_TABLE = """\
local_repo	path	include, exclude, name
remote_repo	url	branch, name
github_repo	url	branch, name
github_org	url	max_repos, visibility, name
github_repo_list	repos	branch, name
bedrock_knowledge_base	knowledge_base_id	region, query, max_results, name
"""
SOURCE_MODELS = {"local_repo": LocalRepoSource, "remote_repo": RemoteRepoSource,
                 "github_repo": GithubRepoSource, "github_org": GithubOrgSource,
                 "github_repo_list": GithubRepoListSource,
                 "bedrock_knowledge_base": BedrockKnowledgeBaseSource}  # fmt: skip

TARGET_FIELDS = ["name", "model_id", "machine", "backend", "num_epochs", "batch_size", "lora_r",
                 "customization_type"]  # fmt: skip

# Values the description presents as what you get when you leave a field out.
DEFAULTS = [
    (OpenSourceConfig, "model_id", "meta-llama/Llama-3.2-1B"),  # "# default — targets can override"
    (SshExecution, "ssh_key", None),  # "optional; uses SSH default otherwise"
    (SshExecution, "remote_dir", "/tmp/mat-runs"),
    (DockerExecution, "container_dir", "/tmp/mat-runs"),
    (SesConfig, "subject_prefix", "[MultiAgentTrainer]"),
    (GithubRepoListSource, "branch", None),  # "optional; applied to all repos"
    (FinetunerConfig, "backend", "opensource"),
    (FinetunerConfig, "jobs_dir", "./finetune-jobs"),
]


def required_fields(model: Any) -> set[str]:
    return {name for name, info in model.model_fields.items() if info.is_required()}


def test_the_top_level_sections_and_what_they_hold() -> None:
    assert set(SECTION_TABLE) <= set(Config.model_fields)
    for section, fields in SECTION_TABLE.items():
        model = SECTION_MODELS.get(section)
        assert model is None or fields <= set(model.model_fields), section


@pytest.mark.parametrize("row", SOURCE_TYPES_TABLE.splitlines())
def test_source_types_table(row: str) -> None:
    source_type, required, optional = row.split("\t")
    model = SOURCE_MODELS[source_type]
    assert get_args(model.model_fields["type"].annotation) == (source_type,)
    assert required_fields(model) == {"type", *required.split(", ")}
    assert set(optional.split(", ")) <= set(model.model_fields) - required_fields(model)


def test_machine_config_table() -> None:
    assert {"name", "execution", "agent_command"} <= set(MachineConfig.model_fields)  # plus gpus (mat deploy)
    assert MachineConfig.model_fields["gpus"].default == 0  # an addition with a default
    assert required_fields(MachineConfig) == {"name"}  # local execution unless one is given
    same_as_training = TrainingConfig.model_fields["execution"].annotation
    assert MachineConfig.model_fields["execution"].annotation == same_as_training


def test_target_fields_table() -> None:
    assert set(TARGET_FIELDS) <= set(FineTuneTarget.model_fields)
    assert required_fields(FineTuneTarget) == {"name"}
    for backend in ("opensource", "bedrock"):
        assert FineTuneTarget(name="t", backend=backend).backend == backend
    assert set(get_args(get_args(FineTuneTarget.model_fields["customization_type"].annotation)[0])) == {
        "CONTINUED_PRE_TRAINING", "FINE_TUNING",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("model", "field", "default"), DEFAULTS, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_defaults_the_description_shows(model: Any, field: str, default: object) -> None:
    assert model.model_fields[field].default == default


def test_value_sets_the_description_lists() -> None:
    assert set(get_args(GithubOrgSource.model_fields["visibility"].annotation)) == {
        "all",
        "public",
        "private",
    }
    assert set(get_args(BedrockConfig.model_fields["customization_type"].annotation)) == {
        "CONTINUED_PRE_TRAINING", "FINE_TUNING",
    }  # fmt: skip


def test_the_backend_snippet_names_the_methods_a_fine_tuner_implements() -> None:
    """The snippet itself cannot run (NOT_AS_WRITTEN); the methods it names are FineTuner's five."""
    snippet = example("adding_a_backend.txt")
    named = set(re.findall(r"^    def (\w+)\(self", snippet, re.MULTILINE))
    assert named == set(FineTuner.__abstractmethods__) == {
        "prepare_dataset", "start_job", "get_status", "cancel_job", "describe",
    }  # fmt: skip


def test_the_install_extras_exist() -> None:
    """`uv pip install -e ".[dev]"` and `".[opensource]"`: the extras are declared by the package."""
    from importlib.metadata import metadata

    extras = set(metadata("multiagenttrainer").get_all("Provides-Extra") or [])
    assert {"dev", "opensource"} <= extras


def test_the_development_lint_command_on_the_package() -> None:
    """`ruff check src/ tests/`, with src/ being multiagenttrainer/ here (see NOT_AS_WRITTEN)."""
    assert not (ROOT / "src").exists()
    ruff = Path(sys.executable).parent / "ruff"
    result = subprocess.run([str(ruff), "check", "multiagenttrainer/", "tests/"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------- the Quick Start, command by command


def quick_start_dir(stand_ins: StandIns, directory: Path) -> Path:
    """A directory whose multiagenttrainer.yaml is the Data Sources example, pointed at the stand-ins."""
    directory.mkdir(parents=True, exist_ok=True)
    config = stand_ins.adapt(example("sources.yaml")) + stand_ins.github_section()
    (directory / "multiagenttrainer.yaml").write_text(config, encoding="utf-8")
    return directory


def run_ids(output: str) -> list[str]:
    return re.findall(r"^run (\S+) completed: ", output, re.MULTILINE)


@pytest.mark.integration
@pytest.mark.timeout(2400)  # seven trainings, one of 10 experiments: over 300 s for that one at load 16
def test_the_quick_start_commands(prefect_api: str, stand_ins: StandIns, tmp_path: Path) -> None:
    work = quick_start_dir(stand_ins, tmp_path / "project")
    env = stand_ins.env(MAT_TRAINING__MAX_EXPERIMENTS="1")  # the file's default is 10; one keeps this short

    def mat(*args: str) -> subprocess.CompletedProcess[str]:
        result = run_mat(list(args), work, env, timeout_s=900)
        assert result.returncode == 0, f"mat {' '.join(args)}:\n{result.stdout}{result.stderr}"
        assert (
            "Traceback" not in result.stderr and "spec-examples-secret" not in result.stdout + result.stderr
        )
        return result

    listed = mat("sources").stdout
    for kind in ("local_repo", "remote_repo", "github_repo", "github_org", "bedrock_knowledge_base",
                 "github_repo_list"):  # fmt: skip
        assert kind in listed

    mat("ingest")
    corpus = (work / "corpus" / "corpus.txt").read_text(encoding="utf-8")
    for marker in ("my-project", "'user/repo'", "'user/other'", "'myorg/myrepo'", "my-org/alpha",
                   "my-org/beta", "Knowledge-base guide"):  # fmt: skip
        assert marker in corpus, marker

    assert len(run_ids(mat("train").stdout)) == 1
    many = mat("train", "--max-experiments", "10", "--output-dir", "./my-runs")
    (run_id,) = run_ids(many.stdout)
    assert len((work / "my-runs" / run_id / "results.tsv").read_text().splitlines()) == 11
    assert run_ids(mat("train", "--name", "llama3").stdout)[0].endswith("-llama3")
    extra = mat("train", "--repo", "myorg/myrepo", "--repo", f"{stand_ins.git.url}/user/other.git")
    assert len(run_ids(extra.stdout)) == 1
    status = mat("status").stdout
    assert all(run_id in status for run_id in run_ids(extra.stdout))  # whole ids, for --resume

    assert len(run_ids(mat("train", "--repo", "myorg/myrepo", "--repo", "user/other").stdout)) == 1
    mat("ingest", "--repo", "myorg/myrepo")
    assert "myorg/myrepo" in mat("sources", "--repo", "myorg/myrepo").stdout


QUICK_START_WATCH = """mat train --config llama3.yaml --name llama3 &
mat train --config mistral.yaml --name mistral &
mat watch
wait
"""


@pytest.mark.integration
def test_the_quick_start_parallel_runs_and_mat_watch(
    prefect_api: str, stand_ins: StandIns, tmp_path: Path
) -> None:
    """ "Run multiple models in parallel and watch progress live", from bash, as written: `mat watch`
    starts before either run's directory exists and shows both runs to the end."""
    for name in ("llama3", "mistral"):  # both keep the default training.output_dir, ./runs, as mat watch does
        document = {
            "sources": [{"type": "local_repo", "path": str(stand_ins.local_project)}],
            "corpus": {"dir": f"./corpus-{name}", "staging_dir": f"./staging-{name}"},
            "training": {"max_experiments": 2},
        }
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(["bash", "-c", QUICK_START_WATCH], cwd=tmp_path, env=stand_ins.env(PATH=path),
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    frame = result.stdout[result.stdout.rindex("2 runs under runs") :]  # the last frame mat watch printed
    assert frame.startswith("2 runs under runs, 0 running")
    for name in ("llama3", "mistral"):
        (line,) = [line for line in frame.splitlines() if line.startswith(name)]
        assert "completed" in line and "2/2" in line
    assert "Nothing is running" not in result.stdout and "Traceback" not in result.stderr
    assert not list((tmp_path / "runs" / ".starting").glob("*.json"))  # each run removed its marker


# ---------------------------------------------------------------- Library Usage


@pytest.mark.integration
def test_the_library_usage_snippet(stand_ins: StandIns, tmp_path: Path) -> None:
    """The snippet as written, run as a script in a directory whose multiagenttrainer.yaml has a source."""
    document = {"sources": [{"type": "local_repo", "path": str(stand_ins.local_project)}],
                "training": {"max_experiments": 2}}  # fmt: skip
    (tmp_path / "multiagenttrainer.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    (tmp_path / "library_usage.py").write_text(example("library_usage.py"), encoding="utf-8")
    result = subprocess.run([sys.executable, "library_usage.py"], cwd=tmp_path, env=stand_ins.env(),
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["experiment 0", "experiment 1"]
    assert all(re.fullmatch(r"experiment \d: val_bpb=\d+\.\d+", line) for line in lines), lines
    assert (tmp_path / "corpus.txt").is_file() and (tmp_path / ".staging").is_dir()


# ---------------------------------------------------------------- Fine-Tuning


def finetune_dir(stand_ins: StandIns, directory: Path, finetuner_example: str, **overrides: Any) -> Path:
    """multiagenttrainer.yaml = a source and a Fine-Tuning example, with its Hub ids at a local model."""
    document = yaml.safe_load(finetuner_example)
    for section, values in overrides.items():
        document["finetuner"].setdefault(section, {}).update(values)
    document["sources"] = [{"type": "local_repo", "path": str(stand_ins.local_project)}]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "multiagenttrainer.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return directory


@pytest.mark.integration
def test_open_source_fine_tuning_commands(
    prefect_api: str, stand_ins: StandIns, tiny_model_dir: Path, tmp_path: Path
) -> None:
    env = stand_ins.env()
    model = {"model_id": str(tiny_model_dir)}  # meta-llama/Llama-3.2-1B needs the Hub
    as_written = finetune_dir(stand_ins, tmp_path / "qlora", example("finetune-opensource.yaml"),
                              opensource=model)  # fmt: skip
    assert run_mat(["ingest"], as_written, env).returncode == 0
    qlora = run_mat(["finetune", "start"], as_written, env)
    assert qlora.returncode == 2 and "CUDA" in qlora.stderr  # use_4bit: "requires bitsandbytes + CUDA"

    # The same on this CPU machine: QLoRA off, sequences the tiny model can hold, and 20 steps of the
    # three epochs (about 1,200 steps of batch 4 on this corpus: two minutes that test nothing more).
    cpu = {**model, "use_4bit": False, "max_length": 32, "max_steps": 20}
    work = finetune_dir(stand_ins, tmp_path / "lora", example("finetune-opensource.yaml"), opensource=cpu)
    plain_text = str(work / "corpus" / "corpus.txt")  # "/path/to/corpus.txt"
    for args in (
        ["ingest"],
        ["finetune", "start"],
        ["finetune", "start", "--corpus", plain_text, "--name", "my-run"],
    ):
        result = run_mat(args, work, env)
        assert result.returncode == 0, f"mat {' '.join(args)}: {result.stdout}{result.stderr}"
    listed = run_mat(["finetune", "list"], work, env)
    jobs = json.loads(run_mat(["finetune", "list", "--json"], work, env).stdout)
    assert listed.returncode == 0 and len(jobs) == 2 and {j["status"] for j in jobs} == {"completed"}
    assert any(j["name"] == "my-run" for j in jobs)
    for job in jobs:
        assert job["id"] in listed.stdout
        status = run_mat(["finetune", "status", job["id"]], work, env)
        assert status.returncode == 0 and "completed" in status.stdout
        assert (Path(job["output_path"]) / "adapter_config.json").is_file()  # output_dir/<job-id>/
        assert Path(job["output_path"]).parent == (work / "finetuned-models").resolve()


@pytest.fixture
def moto_env(stand_ins: StandIns) -> Any:
    """mat's environment with AWS pointed at moto, and the description's bucket created there."""
    with moto_server() as url:
        env = stand_ins.env(AWS_ENDPOINT_URL=url, AWS_MAX_ATTEMPTS="1")
        s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=url,
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        s3.create_bucket(Bucket="my-bucket")
        yield env


@pytest.mark.integration
def test_bedrock_fine_tuning_commands(
    prefect_api: str, stand_ins: StandIns, moto_env: Any, tmp_path: Path
) -> None:
    work = finetune_dir(stand_ins, tmp_path / "bedrock", example("finetune-bedrock.yaml"))
    assert run_mat(["ingest"], work, moto_env).returncode == 0
    started = run_mat(["finetune", "start"], work, moto_env)
    assert started.returncode == 0, started.stdout + started.stderr
    (arn,) = re.findall(r"arn:aws:bedrock:\S+", started.stdout)
    status = run_mat(["finetune", "status", arn], work, moto_env)
    assert status.returncode == 0 and arn in status.stdout
    cancelled = run_mat(["finetune", "cancel", arn], work, moto_env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout or "already ended" in cancelled.stdout
    assert moto_env["AWS_SECRET_ACCESS_KEY"] not in started.stdout + started.stderr


@pytest.mark.integration
def test_multi_target_fine_tuning(
    prefect_api: str, stand_ins: StandIns, tiny_model_dir: Path, moto_env: Any, tmp_path: Path
) -> None:
    """Three targets at once; each inherits finetuner.opensource/bedrock and overrides only its fields."""
    text = example("finetune-targets.yaml").replace("meta-llama/Llama-3.2-3B", str(tiny_model_dir))
    text = text.replace("meta-llama/Llama-3.2-1B", str(tiny_model_dir))  # the Hub ids, at the local model
    bedrock = yaml.safe_load(example("finetune-bedrock.yaml"))["finetuner"]["bedrock"]  # where the data goes
    work = finetune_dir(stand_ins, tmp_path / "targets", text, opensource={"max_length": 32}, bedrock=bedrock)
    assert run_mat(["ingest"], work, moto_env).returncode == 0
    started = run_mat(["finetune", "start"], work, moto_env, timeout_s=900)
    assert started.returncode == 0, started.stdout + started.stderr
    lines = {line.split(":")[0]: line for line in started.stdout.splitlines()}
    assert set(lines) == {"llama-3b-large", "llama-1b-small", "titan-bedrock"}
    jobs = {
        j["target"]: j for j in json.loads(run_mat(["finetune", "list", "--json"], work, moto_env).stdout)
    }
    assert {t: j["status"] for t, j in jobs.items() if t != "titan-bedrock"} == {
        "llama-3b-large": "completed", "llama-1b-small": "completed",
    }  # fmt: skip
    assert jobs["titan-bedrock"]["external_id"].startswith("arn:aws:bedrock:")
    assert {p.name for p in (work / "finetune-jobs").iterdir()} == set(lines)  # a subdirectory per target
