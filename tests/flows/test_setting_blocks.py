"""Machine and SES settings kept in Prefect blocks fill in what a config leaves out (blocks/settings.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prefect.client.orchestration import get_client

from blocks.settings import MachineSettings, SesAlertSettings, register_block_types, with_setting_blocks
from multiagenttrainer.config import Config, SshExecution
from multiagenttrainer.errors import ConfigError

pytestmark = pytest.mark.integration


@pytest.fixture
def saved_blocks(prefect_api: str) -> Iterator[None]:
    """A machine block `gpu-box` and the default SES block, removed afterwards (no other test sees them)."""
    assert register_block_types() == ["mat-machine", "mat-ses-alerts"]
    MachineSettings(
        execution={"type": "ssh", "ssh_host": "trainer@gpu.example.com", "ssh_key": "~/.ssh/gpu_key"},
        agent_command="claude -p {prompt}",
        gpus=2,
    ).save("gpu-box", overwrite=True)
    SesAlertSettings(from_email="alerts@example.com", to_emails=["ops@example.com"], region="eu-west-1").save(
        "default", overwrite=True
    )
    yield
    with get_client(sync_client=True) as client:
        for slug, name in (("mat-machine", "gpu-box"), ("mat-ses-alerts", "default")):
            client.delete_block_document(client.read_block_document_by_name(name, slug).id)


def test_a_machine_without_settings_takes_them_from_its_block(saved_blocks: None) -> None:
    cfg = Config.model_validate(
        {"machines": [{"name": "gpu_box"}, {"name": "laptop", "execution": {"type": "local"}}]}
    )
    filled = with_setting_blocks(cfg)
    gpu, laptop = filled.machines
    assert isinstance(gpu.execution, SshExecution) and gpu.execution.ssh_host == "trainer@gpu.example.com"
    assert (gpu.agent_command, gpu.gpus) == ("claude -p {prompt}", 2)
    assert laptop == cfg.machines[1]  # its own settings win
    assert (
        filled.notifications.ses is not None and filled.notifications.ses.from_email == "alerts@example.com"
    )


def test_what_the_config_sets_wins_over_the_blocks(saved_blocks: None) -> None:
    cfg = Config.model_validate(
        {
            "machines": [{"name": "gpu-box", "gpus": 1}],
            "notifications": {"ses": {"from_email": "mine@example.com", "to_emails": ["me@example.com"]}},
        }
    )
    filled = with_setting_blocks(cfg)
    assert filled.machines[0].gpus == 1 and isinstance(filled.machines[0].execution, SshExecution)
    assert filled.notifications.ses is not None and filled.notifications.ses.from_email == "mine@example.com"


def test_without_blocks_the_config_is_unchanged(prefect_api: str) -> None:
    cfg = Config.model_validate({"machines": [{"name": "nowhere"}]})
    assert with_setting_blocks(cfg) == cfg


def test_a_block_with_bad_settings_is_a_config_error_naming_it(saved_blocks: None) -> None:
    MachineSettings(execution={"type": "teleport"}).save("broken", overwrite=True)
    try:
        with pytest.raises(ConfigError, match="mat-machine block 'broken': execution"):
            with_setting_blocks(Config.model_validate({"machines": [{"name": "broken"}]}))
    finally:
        with get_client(sync_client=True) as client:
            client.delete_block_document(client.read_block_document_by_name("broken", "mat-machine").id)
