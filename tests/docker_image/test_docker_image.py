"""The Dockerfile and docker-compose.yml: the image builds from a local base image, runs mat as a non-root
user and trains in it; the compose file is valid and keeps AWS credentials out.

No image registry is reachable here, so the base image is this machine's Python imported as a tar
(tests/support/python_rootfs.py) and the build installs from a wheelhouse the test makes with pip (from
PyPI, the machine's own wheels and pip's cache) with `--no-index`: the build runs with no network at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from tests.support import dockerd as dockerd_support
from tests.support.dockerd import Dockerd
from tests.support.python_rootfs import python_rootfs

ROOT = Path(__file__).resolve().parents[2]
BASE = "mat-test-python:local"
IMAGE = "mat-test-image:local"
BUILD_ARGS = {
    "BASE_IMAGE": BASE,
    "BUILD_PACKAGES": "",  # the base has no apt-get; mat's native accelerators are optional
    "SYSTEM_PACKAGES": "",  # git is in the base already
    "EXTRAS": "",
    "PIP_OPTIONS": "--no-index --find-links /src/wheelhouse --no-compile",  # offline; no .pyc: a faster build
}
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 600

# The image's build (torch included) takes 3-5 minutes on 2 idle cores and counts against the first test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def dockerd() -> Iterator[Dockerd]:
    """A dockerd of this module's own (own data root and socket, no network for containers)."""
    reason = dockerd_support.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    daemon = Dockerd.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def client(dockerd: Dockerd) -> Iterator[docker.DockerClient]:
    with contextlib.closing(dockerd.client()) as client:
        yield client


def build_context(target: Path) -> Path:
    """The repository's files (tracked and new, as git lists them) plus a wheelhouse for an offline build."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    make_wheelhouse(target / "wheelhouse")
    return target


def make_wheelhouse(target: Path) -> None:
    """Wheels of mat's dependencies, torch and pip's build tools, pinned to what this environment runs."""
    constraints = target.parent / "constraints.txt"
    freeze = [sys.executable, "-m", "pip", "freeze", "--exclude-editable"]
    frozen = subprocess.run(freeze, capture_output=True, text=True, check=True).stdout
    constraints.write_text(frozen, encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(target), "-c", str(constraints),
         "pip", "setuptools>=69", "wheel", "torch==2.13.0", str(target.parent)],
        check=True, capture_output=True, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    for built in target.glob("multiagenttrainer-*.whl"):
        built.unlink()  # the image builds mat from its sources, as it would anywhere


@pytest.fixture(scope="module")
def image(client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> str:
    """mat's image built from the Dockerfile on the local base image, with no network."""
    work = tmp_path_factory.mktemp("image")
    client.api.import_image_from_file(str(python_rootfs(work / "rootfs.tar")), repository=BASE.split(":")[0],
                                      tag=BASE.split(":")[1])  # fmt: skip
    context = build_context(work / "context")
    try:
        client.images.build(
            path=str(context), tag=IMAGE, buildargs=BUILD_ARGS, network_mode="none", rm=True, forcerm=True,
            timeout=BUILD_TIMEOUT_S,
        )  # fmt: skip
    except docker.errors.BuildError as exc:
        log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
        pytest.fail(f"docker build failed: {exc}\n{log[-4000:]}")
    return IMAGE


def run(client: docker.DockerClient, image: str, command: list[str], **options: Any) -> tuple[int, str]:
    """Run `command` in a fresh container of `image` (no network); its exit code and output."""
    container = client.containers.run(image, command, detach=True, network_mode="none", **options)
    try:
        code = container.wait(timeout=RUN_TIMEOUT_S)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_the_image_runs_mat_as_a_non_root_user(client: docker.DockerClient, image: str) -> None:
    code, output = run(client, image, ["--version"])
    assert (code, output.strip()) == (0, "mat 0.1.0")

    code, output = run(client, image, ["-c", "id -u; id -un"], entrypoint=["/bin/sh"])
    assert (code, output.split()) == (0, ["1000", "mat"])
    attrs = client.images.get(image).attrs["Config"]
    assert attrs["Entrypoint"] == ["mat"] and attrs["User"] == "mat"


def test_a_short_mat_train_in_the_image(client: docker.DockerClient, image: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    source = data / "src"
    source.mkdir(parents=True)
    for path in sorted((ROOT / "multiagenttrainer").glob("*.py"))[:8]:
        shutil.copyfile(path, source / path.name)
    config = {
        "sources": [{"type": "local_repo", "path": "/data/src", "name": "tiny"}],
        "corpus": {"dir": "/data/corpus", "staging_dir": "/data/staging"},
        "training": {"max_experiments": 2, "output_dir": "/data/runs"},
        "autoresearch": {"fixed_steps": 3, "train_time": 60},
    }
    (data / "mat.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    os.chmod(tmp_path, 0o755)
    for path in [data, *data.rglob("*")]:
        os.chmod(path, 0o777 if path.is_dir() else 0o666)  # the image's user (uid 1000) writes here

    code, output = run(
        client, image, ["train", "--config", "/data/mat.yaml", "--name", "in-docker"],
        volumes={str(data): {"bind": "/data", "mode": "rw"}},
        environment={"MAT_PREFECT_SERVER": "ephemeral", "OMP_NUM_THREADS": "1", "COLUMNS": "200"},
    )  # fmt: skip

    assert code == 0, output[-4000:]
    (run_dir,) = [p for p in (data / "runs").iterdir() if (p / "run.json").is_file()]
    assert f"run {run_dir.name} completed: /data/runs/{run_dir.name}" in output
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "completed" and len(state["experiments"]) == 2
    assert state["experiments"][0]["summary"]["num_steps"] == 3  # autoresearch.fixed_steps reached train.py
    assert "Traceback" not in output


def compose_config(**env: str) -> dict[str, Any]:
    """`docker-compose config` of the repository's compose file, with `env` as the only extra environment."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is missing (Debian's docker-compose: scripts/install-system-deps.sh)")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GITHUB_", "MAT_", "TORCH_"))}
    result = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = yaml.safe_load(result.stdout)
    return document


def test_the_compose_file_is_valid_and_keeps_aws_credentials_out() -> None:
    aws = {"AWS_PROFILE": "dev", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cret"}
    document = compose_config(**aws)
    services = document["services"]
    assert set(services) == {"postgres", "prefect", "worker", "mat"}
    database = services["prefect"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert database.startswith("postgresql+asyncpg://") and "@postgres:5432/" in database
    for name in ("mat", "worker"):
        service = services[name]
        environment = service.get("environment") or {}
        assert not [key for key in environment if key.startswith("AWS_")], environment
        mounts = [str(volume) for volume in service["volumes"]]
        assert not [m for m in mounts if ".aws" in m], mounts
        assert any(mount.endswith(":/repos:ro") for mount in mounts), mounts
        assert "GITHUB_TOKEN" not in environment or environment["GITHUB_TOKEN"] is None  # unset: not passed
        assert service["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
        assert "opensource" in service["build"]["args"]["EXTRAS"].split(",")
    assert services["worker"]["entrypoint"] == ["prefect"]


def test_the_compose_file_passes_a_github_token_that_is_set_and_mounts_other_repositories() -> None:
    document = compose_config(GITHUB_TOKEN="ghp_example", MAT_REPOS="/srv/repos")
    mat = document["services"]["mat"]
    assert mat["environment"]["GITHUB_TOKEN"] == "ghp_example"
    assert any("/srv/repos" in str(volume) and "/repos" in str(volume) for volume in mat["volumes"])
