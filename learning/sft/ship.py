"""Copy a trained SFT adapter into the package as the embedded default, stored in bf16, with its provenance.

`python -m learning.sft.ship DATA_DIR DEST RUN_DIR [RUN_DIR ...]` (the `make sft-adapter` target runs it): DATA_DIR
is the `rubricem sft generate` folder the runs trained on, each RUN_DIR a `rubricem sft train` folder, in the order
they ran; the last one's adapter is shipped. The shipped adapter is trained in stages, each continuing from the
adapter the previous stage shipped (`--init-adapter agent/adapters/smollm2-sft`), so a CPU run can stop after any
stage with a usable adapter; DEST/PROVENANCE.md records every stage's command and metrics, the data hash and the
generation report. The weights are cast to bfloat16 (half the size; the embedded policy runs in bf16).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

DEST = "agent/adapters/smollm2-sft"
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


def ship(data_dir: Path, dest: Path, run_dirs: Sequence[Path]) -> Path:
    """Write DEST (replacing it) from the last of `run_dirs` and return it."""
    import torch
    from safetensors.torch import load_file, save_file

    if not run_dirs:
        raise ValueError("no run folder given")
    src = run_dirs[-1] / "adapter"
    meta = json.loads((src / "rubricem.json").read_text())
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "adapter_config.json", tmp / "adapter_config.json")
    weights = load_file(str(src / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "rubricem.json").write_text(json.dumps({**meta, "version": "sft", "stages": len(run_dirs)}, indent=2))
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
    for n, run_dir in enumerate(run_dirs, start=1):
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
    if len(sys.argv) < 4:
        sys.exit("usage: python -m learning.sft.ship DATA_DIR DEST RUN_DIR [RUN_DIR ...]")
    print(ship(Path(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]))
