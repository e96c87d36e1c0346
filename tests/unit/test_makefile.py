"""The Makefile's targets run what exists: the bench script, and exactly the SFT stages the provenance records."""

from __future__ import annotations

import re
from pathlib import Path

from learning.sft.ship import DEST, GENERATE_CMD, TRAIN_CMDS

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> list[str]:
    """The target's commands, continuation lines joined, make variables for the venv and SFT_DEST expanded."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    body = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n?)+)", text, re.MULTILINE)
    assert body is not None, f"no {target} target"
    lines = [" ".join(ln.split()) for ln in body.group(1).splitlines() if ln.strip()]
    return [ln.replace("$(VENV)/bin/", "").replace("$(SFT_DEST)", DEST) for ln in lines]


def test_sft_adapter_runs_the_generation_and_every_recorded_stage_in_order() -> None:
    recipe = _recipe("sft-adapter")
    assert recipe[0] == GENERATE_CMD
    trains = [ln for ln in recipe if ln.startswith("rubricem sft train")]
    assert trains == list(TRAIN_CMDS)
    ships = [ln for ln in recipe if "learning.sft.ship" in ln]
    assert len(ships) == len(TRAIN_CMDS)  # each stage is shipped, so the target can stop after any stage
    assert ships[-1].endswith(" ".join(f".cache/sft/{'run' if k == 1 else f'run-{k}'}" for k in range(1, len(TRAIN_CMDS) + 1)))


def test_bench_runs_a_script_that_exists() -> None:
    for line in _recipe("bench"):
        scripts = re.findall(r"(tests/benchmarks/\S+\.py)", line)
        assert scripts and all((ROOT / s).is_file() for s in scripts)
