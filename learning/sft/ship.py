"""Copy a trained SFT adapter into the package as the embedded default, stored in bf16, with its provenance.

`python -m learning.sft.ship RUN_DIR DATA_DIR DEST` (the `make sft-adapter` target runs it): RUN_DIR is a
`rubricem sft train` folder, DATA_DIR the `rubricem sft generate` folder it trained on. The weights are cast to
bfloat16 (half the size; the embedded policy runs in bf16), and DEST/PROVENANCE.md records the commands, the data
hash, the generation report and the training metrics.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

GENERATE_CMD = ("rubricem sft generate --questions learning/sft/data/train/hotpotqa_train.json "
                "--questions learning/sft/data/train/musique_train.json --variants 2 --out .cache/sft/data")
TRAIN_CMD = "rubricem sft train --data .cache/sft/data --out .cache/sft/run --preset cpu --threads 2 --no-register"


def ship(run_dir: Path, data_dir: Path, dest: Path) -> Path:
    """Write DEST (replacing it) and return it."""
    import torch
    from safetensors.torch import load_file, save_file

    src = run_dir / "adapter"
    meta = json.loads((src / "rubricem.json").read_text())
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "adapter_config.json", tmp / "adapter_config.json")
    weights = load_file(str(src / "adapter_model.safetensors"))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "rubricem.json").write_text(json.dumps({**meta, "version": "sft"}, indent=2))
    report = json.loads((data_dir / "report.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    secs = sum(r["seconds"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    lines = [
        "# The shipped SFT adapter (SmolLM2-135M-Instruct, LoRA)",
        "",
        "Distilled from evidence-chain teacher trajectories (`learning/sft/evidence_teacher.py`) on the training split",
        "of the corpus-paired HotpotQA and MuSiQue questions (`learning/sft/data/train`; the held-out split in",
        "`learning/sft/data/heldout` was never trained on). Reproduce with `make sft-adapter` (2 cores), which runs:",
        "",
        f"    {GENERATE_CMD}",
        f"    {TRAIN_CMD}",
        "    python -m learning.sft.ship .cache/sft/run .cache/sft/data agent/adapters/smollm2-sft",
        "",
        f"- data hash (`learning.sft.train.data_sha`): `{meta['data_sha']}`; {meta['examples']} kept trajectories",
        f"- generation outcomes: {json.dumps(report['outcomes'])}",
        f"- preset `{meta['preset']}`: {json.dumps(meta['config'])}",
        f"- {meta['steps']} optimizer steps, {tokens:,} tokens in {secs / 60:.1f} min ({tokens / max(secs, 1):.0f} tokens/s)",
        f"- loss (mean NLL of trained tokens): first step {meta['first_loss']:.4f}, last step {meta['final_loss']:.4f}",
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
    print(ship(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
