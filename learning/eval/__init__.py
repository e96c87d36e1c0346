"""Benchmark evaluation: load a benchmark from a data folder, run the agent on each item, score it with that
benchmark's own method (EM/F1/cover-EM, HealthBench rubric points, DRB RACE, ScholarQA-CS rubrics) and write
per-item JSONL (with each item's tokens and cost, usage.py), a summary table and a plot; over several seeds, each
metric's mean and standard deviation (spread.py). Entry points: `learning.eval.runner.run_eval` and
`run_eval_seeds`.

The learning curve's pieces live here too: the project's held-out questions, the guard that keeps them out of
training and the per-session figures a small model can move (heldout.py), and the curve's statistics (curve.py)."""
