"""Benchmark evaluation: load a benchmark from a data folder, run the agent on each item, score it with that
benchmark's own method (EM/F1/cover-EM, HealthBench rubric points, DRB RACE, ScholarQA-CS rubrics) and write
per-item JSONL, a summary table and a plot. Entry point: `learning.eval.runner.run_eval`."""
