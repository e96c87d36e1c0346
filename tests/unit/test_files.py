"""`learning.engines.files.json_lines`: the rows a resumable run appended, read back after a kill."""

from __future__ import annotations

from pathlib import Path

from learning.engines.files import json_lines


def test_a_torn_last_line_and_non_objects_are_skipped_and_a_missing_file_has_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert json_lines(path) == []
    path.write_text('{"item": "a", "n": 1}\n[1, 2]\n\n{"item": "b"}\n{"item": "c", "n"', encoding="utf-8")
    assert json_lines(path) == [{"item": "a", "n": 1}, {"item": "b"}]
