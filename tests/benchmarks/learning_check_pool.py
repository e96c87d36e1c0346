"""Pool several learning-check reports (runs with different --seed) into one paired comparison per credit mode.

    .venv/bin/python tests/benchmarks/learning_check_pool.py docs/learning_check/learning_check.json \
        docs/learning_check/seed1/learning_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_check import CREDITS, METRICS, pooled_difference


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", type=Path, help="learning_check.json files")
    p.add_argument("--resamples", type=int, default=4000)
    a = p.parse_args(argv)
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in a.reports]
    for credit in CREDITS:
        print(f"{credit} (final - base over {len(reports)} runs):")
        for metric in METRICS:
            d = pooled_difference(reports, credit, metric, a.resamples)
            print(f"  {metric:8s} {d['mean']:+.4f}  95% CI {d['ci_low']:+.4f}..{d['ci_high']:+.4f}  "
                  f"sign-flip p={d['p_sign_flip']:.4f}  ({d['questions']} questions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
