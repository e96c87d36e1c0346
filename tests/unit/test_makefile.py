"""The Makefile's targets run what exists: the bench script, and exactly the SFT stages the provenance records."""

from __future__ import annotations

import re
from pathlib import Path

from learning.sft.ship import DEST, GENERATE_CMD, TRAIN_CMDS

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> list[str]:
    """The target's commands, continuation lines joined, make variables for the venv and SFT_DEST expanded."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    dest = re.search(r"^SFT_DEST\s*:=\s*(\S+)", text, re.MULTILINE)
    assert dest is not None and dest.group(1) == DEST  # the Makefile ships where the embedded default looks
    body = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n?)+)", text, re.MULTILINE)
    assert body is not None, f"no {target} target"
    lines = [" ".join(ln.split()) for ln in body.group(1).splitlines() if ln.strip()]
    return [ln.replace("$(VENV)/bin/", "").replace("$(SFT_DEST)", dest.group(1)) for ln in lines]


def test_sft_adapter_runs_the_generation_and_every_recorded_stage_in_order() -> None:
    recipe = _recipe("sft-adapter")
    assert recipe[0] == GENERATE_CMD
    trains = [ln for ln in recipe if ln.startswith("rubricem sft train")]
    assert trains == list(TRAIN_CMDS)
    ships = [ln for ln in recipe if "learning.sft.ship" in ln]
    assert len(ships) == len(TRAIN_CMDS)  # each stage is shipped, so the target can stop after any stage
    runs = [re.search(r"--out (\S+)", cmd).group(1) for cmd in TRAIN_CMDS]  # type: ignore[union-attr]
    for k, ship in enumerate(ships, start=1):  # stage k ships every run so far, in order
        assert ship.endswith(f"learning.sft.ship .cache/sft/data {DEST} " + " ".join(runs[:k]))


def test_bench_runs_a_script_that_exists() -> None:
    for line in _recipe("bench"):
        scripts = re.findall(r"(tests/benchmarks/\S+\.py)", line)
        assert scripts and all((ROOT / s).is_file() for s in scripts)
