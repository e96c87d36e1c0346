"""Copy a trained SFT adapter into the package as the embedded default, stored in bf16, with its provenance.

`python -m learning.sft.ship DATA_DIR DEST RUN_DIR [RUN_DIR ...]` (the `make sft-adapter` target runs it): DATA_DIR
is the `rubricem sft generate` folder the runs trained on, each RUN_DIR a `rubricem sft train` folder, in the order
they ran; the last one's adapter is shipped. The shipped adapter is trained in stages, each continuing from the
adapter the previous stage shipped (`--init-adapter agent/adapters/smollm2-sft`), so a CPU run can stop after any
stage with a usable adapter; DEST/PROVENANCE.md records every stage's command and metrics, the data hash and the
generation report. The weights are cast to bfloat16 (half the size; the embedded policy runs in bf16).

`--after-shipped` adds stages to the adapter already in DEST without the earlier stages' run folders (they live on
the machine that trained them): the stage blocks of DEST/PROVENANCE.md are kept as they are and the given runs become
the next stages. The first of them must have started from DEST (`--init-adapter DEST`), or nothing is written.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

DEST = "agent/adapters/smollm2-sft"
BASE_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GENERATE_CMD = ("rubricem sft generate --questions learning/sft/data/train/hotpotqa_train.json "
                "--questions learning/sft/data/train/musique_train.json --variants 2 --out .cache/sft/data")
# The stages of `make sft-adapter`, in order (stage k+1 starts from the adapter stage k shipped to DEST).
TRAIN_CMDS = (
    "rubricem sft train --data .cache/sft/data --out .cache/sft/run --preset cpu --threads 2 --no-register",
    f"rubricem sft train --data .cache/sft/data --out .cache/sft/run-2 --preset cpu --init-adapter {DEST} "
    "--epochs 1 --seed 1 --threads 2 --no-register",
    f"rubricem sft train --data .cache/sft/data --out .cache/sft/run-3 --preset cpu --init-adapter {DEST} "
    "--epochs 0.5 --seed 2 --threads 2 --no-register",
)
_STAGE_BLOCK = re.compile(r"^- stage \d+: .*(?:\n  - .*)*", re.MULTILINE)


def shipped_stages(dest: Path) -> list[str]:
    """The stage blocks (`- stage N: ...` and its indented lines) of DEST/PROVENANCE.md, in order; [] if none."""
    path = dest / "PROVENANCE.md"
    return _STAGE_BLOCK.findall(path.read_text()) if path.is_file() else []


def _stage_lines(n: int, run_dir: Path) -> list[str]:
    meta = json.loads((run_dir / "adapter" / "rubricem.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    secs = sum(r["seconds"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    cfg = meta["config"]
    return [
        f"- stage {n}: `{TRAIN_CMDS[n - 1] if n <= len(TRAIN_CMDS) else run_dir}`",
        f"  - {cfg['epochs']} epoch(s), lr {cfg['learning_rate']}, {meta['steps']} optimizer steps of "
        f"{cfg['grad_accum']} sequences, {tokens:,} tokens in {secs / 60:.1f} min ({tokens / max(secs, 1):.0f} "
        "tokens/s)",
        f"  - loss (mean NLL of trained tokens): first step {meta['first_loss']:.4f}, last step "
        f"{meta['final_loss']:.4f}",
        f"  - data hash `{meta['data_sha']}` ({meta['examples']} trajectories)",
    ]


def ship(data_dir: Path, dest: Path, run_dirs: Sequence[Path], after_shipped: bool = False) -> Path:
    """Write DEST (replacing it) from the last of `run_dirs` and return it.

    With `after_shipped` the runs continue the adapter in DEST: its recorded stages are kept and the runs numbered
    after them. Raises ValueError (nothing written) when DEST records no stage or the first run did not start from
    DEST."""
    import torch
    from safetensors.torch import load_file, save_file

    if not run_dirs:
        raise ValueError("no run folder given")
    prior = shipped_stages(dest) if after_shipped else []
    if after_shipped:
        first = json.loads((run_dirs[0] / "adapter" / "rubricem.json").read_text()).get("init_adapter")
        if not prior:
            raise ValueError(f"{dest}/PROVENANCE.md records no stage to continue")
        if first is None or Path(first).resolve() != dest.resolve():
            raise ValueError(f"{run_dirs[0]} started from {first!r}, not from the shipped adapter {dest}")
    src = run_dirs[-1] / "adapter"
    meta = json.loads((src / "rubricem.json").read_text())
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # The training machine's model folder means nothing elsewhere: name the base model by its public id.
    config = json.loads((src / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE_MODEL_ID
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = load_file(str(src / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "rubricem.json").write_text(json.dumps({**meta, "version": "sft", "stages": len(prior) + len(run_dirs)}, indent=2))
    report = json.loads((data_dir / "report.json").read_text())
    lines = [
        "# The shipped SFT adapter (SmolLM2-135M-Instruct, LoRA)",
        "",
        "Distilled from evidence-chain teacher trajectories (`learning/sft/evidence_teacher.py`) on the training split",
        "of the corpus-paired HotpotQA and MuSiQue questions (`learning/sft/data/train`; the held-out split in",
        "`learning/sft/data/heldout` was never trained on). Reproduce with `make sft-adapter` (2 cores), which",
        f"generates the data (`{GENERATE_CMD}`), then runs each training stage and ships its adapter here with",
        f"`python -m learning.sft.ship .cache/sft/data {DEST} RUN...`:",
        "",
    ]
    lines += prior
    for n, run_dir in enumerate(run_dirs, start=len(prior) + 1):
        lines += _stage_lines(n, run_dir)
    lines += [
        "",
        f"- last stage's data hash (`learning.sft.train.data_sha`): `{meta['data_sha']}`; {meta['examples']} kept "
        "trajectories (a stage whose hash differs trained on data an earlier teacher version wrote)",
        f"- generation outcomes: {json.dumps(report['outcomes'])}",
        f"- last stage's settings (preset `{meta['preset']}` plus flags): {json.dumps(meta['config'])}",
        "- weights stored in bfloat16",
        "",
        "Data: HotpotQA (CC BY-SA 4.0) and MuSiQue (CC BY 4.0) questions via HippoRAG's corpus-paired files (MIT);",
        "see `learning/sft/data/ATTRIBUTION.md`.",
    ]
    (tmp / "PROVENANCE.md").write_text("\n".join(lines) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


if __name__ == "__main__":
    args = sys.argv[1:]
    after = "--after-shipped" in args
    args = [a for a in args if a != "--after-shipped"]
    if len(args) < 3:
        sys.exit("usage: python -m learning.sft.ship DATA_DIR DEST [--after-shipped] RUN_DIR [RUN_DIR ...]")
    try:
        print(ship(Path(args[0]), Path(args[1]), [Path(p) for p in args[2:]], after_shipped=after))
    except ValueError as exc:
        sys.exit(f"error: {exc}")
