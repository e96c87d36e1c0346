"""The shipped train / held-out split of the corpus-paired questions (run once; the result is in learning/sft/data).

`python -m learning.sft.split ../shared/data/wiki_multihop_corpus learning/sft/data` copies HotpotQA's and MuSiQue's
corpus-paired question files, byte-for-byte per record, into `train/` and `heldout/` with the file names the eval
loader reads (`rubricem eval hotpotqa --data-dir learning/sft/data/heldout`). The held-out split is drawn with
`random.Random(SEED).sample` (HELDOUT_PER_FILE of each file) before any training and is never trained on; the demo
question (the Makefile's DEMO_Q) is always held out, so the demo shows a question the adapter never saw.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261124
HELDOUT_PER_FILE = 16
FILES = ("hotpotqa_train.json", "musique_train.json")
ALWAYS_HELD_OUT = ("What language were books being translated into during the era of Haymo of Faversham?",)


def split(records: list[dict], n_heldout: int, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(train, heldout), each in the original order."""
    forced = [i for i, r in enumerate(records) if r.get("question") in ALWAYS_HELD_OUT]
    rest = [i for i in range(len(records)) if i not in forced]
    held = set(forced) | set(random.Random(seed).sample(rest, n_heldout - len(forced)))
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


def main(argv: list[str]) -> int:
    """Write DST/train/<file> and DST/heldout/<file> for each question file in SRC."""
    src, dst = Path(argv[0]), Path(argv[1])
    for name in FILES:
        records = json.loads((src / name).read_text(encoding="utf-8"))
        train, held = split(records, HELDOUT_PER_FILE)
        for part, rows in (("train", train), ("heldout", held)):
            (dst / part).mkdir(parents=True, exist_ok=True)
            (dst / part / name).write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        print(f"{name}: {len(train)} train, {len(held)} held out")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
