"""A fine-tuning backend added from outside mat (README "Adding a backend"), found through MAT_PLUGINS or an
entry point, validated by the real `mat config validate` and started by the real `mat finetune start`.

The plugin is tests/finetune/mycloud_backend.py; it is only ever imported by `mat` subprocesses, so
the registry of this test process keeps only the built-in backends.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.finetune.conftest import ROOT, mat, mat_env, mat_json

PLUGIN = "tests.finetune.mycloud_backend"
PLUGIN_FILE = ROOT / "tests" / "finetune" / "mycloud_backend.py"


def plugin_env(**extra: str) -> dict[str, str]:
    """The environment of a `mat` that loads the plugin, as README says: MAT_PLUGINS and PYTHONPATH."""
    return mat_env(MAT_PLUGINS=PLUGIN, PYTHONPATH=str(ROOT), **extra)


def write_yaml(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def mycloud_config(directory: Path, **finetuner: Any) -> Path:
    """A config whose finetuner uses the mycloud backend, jobs and corpus inside `directory`."""
    section = {"backend": "mycloud", "jobs_dir": str(directory / "jobs"), **finetuner}
    corpus = {"dir": str(directory / "corpus"), "staging_dir": str(directory / "staging")}
    return write_yaml(directory / "mat.yaml", {"finetuner": section, "corpus": corpus})


# ---------------------------------------------------------------- the README shows what the plugin does


def readme_backend_block() -> str:
    """The Python block of README.md's "Adding a backend" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Adding a backend") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README's Adding a backend section has no Python block"
    return match.group(1)


def shape(source: str) -> dict[str, Any]:
    """What a backend module declares: imports, classes with bases and method signatures, top-level calls."""
    tree = ast.parse(source)
    imports = sorted(ast.unparse(n) for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import))
    classes = {}
    for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        methods = {f.name: ast.unparse(f.args) + " -> " + ast.unparse(f.returns or ast.Constant(None))
                   for f in node.body if isinstance(f, ast.FunctionDef)}  # fmt: skip
        fields = sorted(ast.unparse(a) for a in node.body if isinstance(a, ast.AnnAssign | ast.Assign))
        classes[node.name] = {
            "bases": [ast.unparse(b) for b in node.bases],
            "methods": methods,
            "fields": fields,
        }
    calls = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    return {"imports": imports, "classes": classes, "calls": calls}


def test_the_readme_example_is_the_tested_plugin() -> None:
    readme, plugin = shape(readme_backend_block()), shape(PLUGIN_FILE.read_text(encoding="utf-8"))
    assert (
        readme["calls"] == plugin["calls"] == ["register_backend('mycloud', MyCloudFineTuner, MyCloudConfig)"]
    )
    assert readme["classes"] == plugin["classes"]
    assert set(readme["imports"]) <= set(plugin["imports"])  # the plugin adds what its bodies use
    assert set(readme["classes"]["MyCloudFineTuner"]["methods"]) == {
        "__init__", "prepare_dataset", "start_job", "get_status", "cancel_job", "describe",
    }  # fmt: skip


# ---------------------------------------------------------------- the config knows registered backends only


def test_config_with_the_plugin_backend_validates(tmp_path: Path) -> None:
    config = mycloud_config(
        tmp_path, mycloud={"model_id": "mycloud-base"},
        targets=[{"name": "small"}, {"name": "large", "model_id": "mycloud-large", "epochs": 3}],
    )  # fmt: skip
    result = mat("config", "validate", str(config), env=plugin_env())
    assert result.returncode == 0, result.stderr
    assert f"{config}: valid (0 sources, 0 machines, 2 targets)" in result.stdout


def test_without_the_plugin_the_backend_and_its_section_are_refused(tmp_path: Path) -> None:
    config = mycloud_config(
        tmp_path, mycloud={"model_id": "mycloud-base"}, targets=[{"name": "t", "backend": "mycloud"}]
    )
    result = mat("config", "validate", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    registered = "registered backends: bedrock, opensource"
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("error: finetuner.backend: ")] == [
        f"error: finetuner.backend: unknown backend 'mycloud'; {registered} (a plugin registers more: "
        f"name its module in MAT_PLUGINS or install it with an entry point in the group "
        f"multiagenttrainer.backends) ({config}:2)"
    ]
    assert any(
        line.startswith("error: finetuner.targets[0].backend: unknown backend 'mycloud'") for line in lines
    )
    (section,) = [line for line in lines if line.startswith("error: finetuner.mycloud: ")]
    assert "backends: bedrock, opensource" in section and section.endswith(f"({config}:4)")


def test_a_bad_value_in_the_plugin_section_names_its_path_and_line(tmp_path: Path) -> None:
    config = mycloud_config(tmp_path, mycloud={"model_id": "m", "epochs": 0, "region": "x"}, jobs_dir=5)
    result = mat("config", "validate", str(config), env=plugin_env())
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: finetuner.jobs_dir: input should be a valid string ({config}:3)",
        f"error: finetuner.mycloud.epochs: input should be greater than or equal to 1 ({config}:6)",
        f"error: finetuner.mycloud.region: unknown field; check the spelling against "
        f"configs/config.example.yaml ({config}:7)",
    ]


def test_a_plugin_that_cannot_be_imported_is_a_config_error(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "mat.yaml", {"finetuner": {"backend": "opensource"}})
    result = mat("config", "validate", str(config), env=mat_env(MAT_PLUGINS="no_such_plugin_module"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        "error: MAT_PLUGINS: plugin module 'no_such_plugin_module' cannot be loaded (ModuleNotFoundError: "
    )


def test_an_entry_point_registers_the_backend(tmp_path: Path) -> None:
    """An installed distribution with an entry point in the group `multiagenttrainer.backends`."""
    site = tmp_path / "site"
    dist_info = site / "mycloud_plugin-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mycloud-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[multiagenttrainer.backends]\nmycloud = {PLUGIN}\n")
    config = mycloud_config(tmp_path, targets=[{"name": "only"}])
    result = mat("config", "validate", str(config), env=mat_env(PYTHONPATH=f"{site}:{ROOT}"))
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- mat finetune start with the plugin


@pytest.mark.integration
def test_finetune_start_prints_every_target_on_stdout_when_one_fails(
    prefect_api: str, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "corpus.jsonl").write_text(json.dumps({"text": "def f():\n    return 1\n"}) + "\n")
    targets = [{"name": "good"}, {"name": "broken", "model_id": "missing-model"}]
    config = mycloud_config(tmp_path, targets=targets)

    result = mat("finetune", "start", "--config", str(config), "--name", "pair", env=plugin_env())

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    good, broken = result.stdout.splitlines()  # both targets, the failed one included, on stdout
    assert good == "good: job pair-good-mycloud running mycloud:pair-good-mycloud"
    reason = "mycloud has no model 'missing-model'; set finetuner.mycloud.model_id"
    assert re.fullmatch(rf"broken: job (pair-broken-\S+) failed \({re.escape(reason)}\)", broken), broken
    job_id = broken.split()[2]
    assert result.stderr.splitlines() == [f"error: target 'broken' (job {job_id}) failed: {reason}"]
    jobs = {
        job["target"]: job for job in mat_json("finetune", "list", "--config", str(config), env=plugin_env())
    }
    assert (jobs["good"]["status"], jobs["broken"]["status"]) == ("running", "failed")
    assert jobs["good"]["dataset"] == {"train_records": 1} and jobs["broken"]["backend"] == "mycloud"

    status = mat_json("finetune", "status", "pair-good-mycloud", "--config", str(config), env=plugin_env())
    assert status["status"] == "completed"  # refreshed through the plugin's get_status
    cancel = mat("finetune", "cancel", "pair-good-mycloud", "--config", str(config), env=plugin_env())
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == (
        f"job pair-good-mycloud already ended (completed at {status['finished_at']}); nothing to cancel"
    )
