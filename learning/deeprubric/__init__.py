"""DeepRubric (METHOD §11): evidence trees, joint query–rubric synthesis, the KEEP/REVISE/DROP audit, statistics.

Modules, by concern: `text` and `facets` (pure helpers and the sibling rules), `records` (frozen records and their
JSON), `tree` (growing a tree behind the Retriever/Proposer/Extractor/Gate interfaces), `offline` (the deterministic
proposer and extractor), `corpus` (seed pages and `local_search` as the retriever), `select` and `synthesis` (leaf
selection, bottom-up merge, rubrics), `audit` (rules, repair, invariants), `stats`, and `build` (the resumable
build folder). Using the pairs (issue 15 item 6): `pairs` (reading a pairs.jsonl; criteria → the stagewise judge's
persistent Answer-stage rubrics), `reward` (the pure §11.6 reward maths) and `scorer` (0–4 criterion scoring by a
judge endpoint or the offline MiniLM approximation; the trainer's `deeprubric` reward). Only `build`, `corpus` and
`pairs.load_pairs` do I/O.
"""
