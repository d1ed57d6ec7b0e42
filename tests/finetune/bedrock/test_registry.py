"""Backend registry and target resolution: targets inherit their backend's section and override fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from multiagenttrainer.config import BedrockConfig, FinetunerConfig, OpenSourceConfig
from multiagenttrainer.errors import ConfigError
from multiagenttrainer.finetune import (
    BACKENDS,
    ResolvedTarget,
    make_finetuner,
    resolve_targets,
    select_target,
)
from multiagenttrainer.finetune.bedrock import BedrockFineTuner

EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "examples" / "finetune-targets.yaml"


def example_config() -> FinetunerConfig:
    return FinetunerConfig.model_validate(yaml.safe_load(EXAMPLE.read_text())["finetuner"])


def test_no_targets_gives_one_default_target_from_the_backend():
    cfg = FinetunerConfig(
        backend="bedrock", bedrock=BedrockConfig(base_model_id="amazon.titan-text-express-v1")
    )
    [target] = resolve_targets(cfg)
    assert target == ResolvedTarget("default", "bedrock", cfg.bedrock, None)
    assert resolve_targets(FinetunerConfig())[0].config == OpenSourceConfig()


def test_example_targets_inherit_defaults_and_override_declared_fields():
    targets = {t.name: t for t in resolve_targets(example_config())}
    assert list(targets) == ["llama-3b-large", "llama-1b-small", "titan-bedrock"]

    large = targets["llama-3b-large"]
    assert (large.backend, large.machine) == ("opensource", "gpu-large")
    assert isinstance(large.config, OpenSourceConfig)
    assert (large.config.model_id, large.config.num_epochs, large.config.batch_size) == (
        "meta-llama/Llama-3.2-3B",
        3,
        2,
    )
    assert large.config.output_dir == "./finetuned-models"  # inherited from finetuner.opensource
    assert large.config.lora_r == OpenSourceConfig().lora_r

    small = targets["llama-1b-small"]
    assert (small.config.num_epochs, small.config.batch_size) == (5, 4)

    titan = targets["titan-bedrock"]
    assert titan.backend == "bedrock" and isinstance(titan.config, BedrockConfig)
    assert titan.config.base_model_id == "amazon.titan-text-lite-v1"
    assert titan.config.customization_type == "FINE_TUNING"
    assert titan.config.epochs == BedrockConfig().epochs


def test_bedrock_targets_map_epoch_fields_and_keep_the_section():
    cfg = FinetunerConfig.model_validate(
        {
            "backend": "bedrock",
            "bedrock": {"role_arn": "arn:aws:iam::1:role/r", "region": "eu-west-1", "learning_rate": 3e-5},
            "targets": [{"name": "a", "num_epochs": 2, "batch_size": 3}, {"name": "b", "epochs": 4}],
        }
    )
    a, b = resolve_targets(cfg)
    assert isinstance(a.config, BedrockConfig) and isinstance(b.config, BedrockConfig)
    assert (a.config.epochs, a.config.batch_size, a.config.learning_rate) == (2, 3, 3e-5)
    assert (a.config.role_arn, a.config.region) == ("arn:aws:iam::1:role/r", "eu-west-1")
    assert b.config.epochs == 4 and b.config.batch_size == 1
    assert cfg.bedrock.epochs == 1  # the section itself is not modified


def test_fields_that_do_not_apply_or_fractional_bedrock_epochs_are_config_errors():
    cfg = FinetunerConfig.model_validate({"targets": [{"name": "t", "backend": "bedrock", "lora_r": 8}]})
    with pytest.raises(
        ConfigError, match=r"finetuner\.targets\[0\] \('t'\): 'lora_r' does not apply to the bedrock"
    ):
        resolve_targets(cfg)
    cfg = FinetunerConfig.model_validate(
        {"targets": [{"name": "t", "backend": "bedrock", "num_epochs": 1.5}]}
    )
    with pytest.raises(ConfigError, match="whole number of epochs"):
        resolve_targets(cfg)
    cfg = FinetunerConfig.model_validate({"targets": [{"name": "t", "customization_type": "FINE_TUNING"}]})
    with pytest.raises(ConfigError, match="'customization_type' does not apply to the opensource backend"):
        resolve_targets(cfg)


def test_select_target_by_name():
    targets = resolve_targets(example_config())
    assert select_target(targets, "titan-bedrock").backend == "bedrock"
    assert select_target(targets, None).name == "llama-3b-large"
    with pytest.raises(
        ConfigError, match="configured targets: llama-3b-large, llama-1b-small, titan-bedrock"
    ):
        select_target(targets, "nope")


def test_make_finetuner_builds_the_registered_backend(tmp_path):
    from multiagenttrainer.finetune.base import JobStore

    titan = select_target(resolve_targets(example_config()), "titan-bedrock")
    tuner = make_finetuner(titan, JobStore(tmp_path))
    assert isinstance(tuner, BedrockFineTuner)
    assert (tuner.target, tuner.cfg) == ("titan-bedrock", titan.config)
    assert tuner.describe().startswith("bedrock amazon.titan-text-lite-v1 FINE_TUNING epochs=1")


def test_unknown_backend_lists_the_valid_ones(tmp_path):
    from multiagenttrainer.finetune.base import JobStore

    bogus = ResolvedTarget("x", "sagemaker", BedrockConfig())
    with pytest.raises(
        ConfigError, match="unknown backend 'sagemaker'; registered backends: bedrock, opensource"
    ):
        make_finetuner(bogus, JobStore(tmp_path))
    assert set(BACKENDS) == {"opensource", "bedrock"}
