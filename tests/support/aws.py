"""AWS in tests: an environment free of the developer's AWS settings, moto's server, and its sent mail."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_SES",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
)


def isolate_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No credentials, profiles, endpoints or instance metadata from the machine, and a fresh boto3 session.

    boto3's default session caches the credentials it first finds; replacing it (monkeypatch puts the
    old one back) keeps one test's fake credentials from leaking into the next.
    """
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    return monkeypatch


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server on a free port of 127.0.0.1; yields its base URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def sent_messages(moto_url: str) -> list[dict[str, Any]]:
    """Every e-mail a moto server's SES has accepted, from its model data endpoint."""
    with urllib.request.urlopen(f"{moto_url}/moto-api/data.json", timeout=10) as response:
        messages: list[dict[str, Any]] = json.load(response).get("ses", {}).get("Message", [])
    return messages
