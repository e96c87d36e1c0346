"""The shipped accelerate launch configs (the scale-out path) are valid accelerate cluster configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "learning" / "accelerate").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_as_an_accelerate_cluster_config(path: Path) -> None:
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.compute_environment.value == "LOCAL_MACHINE"
    raw = yaml.safe_load(path.read_text())
    if raw["distributed_type"] == "DEEPSPEED":
        assert cfg.deepspeed_config["zero_stage"] == 3
    if raw["distributed_type"] == "FSDP":
        assert cfg.fsdp_config["fsdp_version"] == 2


def test_the_expected_configs_ship() -> None:
    assert {p.stem for p in CONFIGS} == {"cpu", "deepspeed_zero3", "fsdp"}
