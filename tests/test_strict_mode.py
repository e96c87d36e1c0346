"""Strict mode (RUBRICEM_TEST_STRICT=1, `make test`) also fails a module that skips at collection (issue 61).

A module-level `pytest.importorskip` or `pytest.skip(allow_module_level=True)` raises while the module is imported, so
no test item exists and `pytest_runtest_makereport` never sees the skip: before issue 61 such a module gave
"1 skipped" and rc 0 under `make test`. These tests run an inner pytest in process (`pytester`) whose conftest
imports the real hooks from tests/conftest.py, so a change to those hooks is what they test. That a runtime skip fails
and a `may_skip` one stays a skip is covered by tests/unit/test_strict_skips.py (a subprocess run).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# The inner run's conftest: our hooks, not a copy (they read RUBRICEM_TEST_STRICT at each call).
CONFTEST = "from tests.conftest import pytest_configure, pytest_make_collect_report, pytest_runtest_makereport\n"
MODULES = {
    "test_needs_a_module": 'import pytest\n\npytest.importorskip("rubricem_no_such_module")\n\n\n'
                           "def test_uses_it():\n    pass\n",
    "test_needs_a_gpu": 'import pytest\n\npytest.skip("no GPU here", allow_module_level=True)\n\n\n'
                        "def test_uses_it():\n    pass\n",
    "test_runs": "def test_runs():\n    assert True\n",
}


def _write(pytester: pytest.Pytester, *names: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(**{n: MODULES[n] for n in names})


@pytest.mark.parametrize(("module", "reason"), [
    ("test_needs_a_module", "Skipped: could not import 'rubricem_no_such_module'"),
    ("test_needs_a_gpu", "Skipped: no GPU here"),
])  # fmt: skip
def test_a_module_that_skips_at_collection_fails_under_strict(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch, module: str,
                                                              reason: str) -> None:
    monkeypatch.setenv("RUBRICEM_TEST_STRICT", "1")
    _write(pytester, module, "test_runs")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    # A collection error: pytest stops before running anything, exit status 2, not 0.
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    result.assert_outcomes(errors=1)
    # The failure names the module and the reason it skipped, in the runtime hook's wording.
    result.stdout.fnmatch_lines([f"*{module}.py skipped at collection under RUBRICEM_TEST_STRICT=1 (make test, CI), "
                                 f"where every test must run: {reason}*"])


def test_without_strict_a_module_level_skip_stays_a_skip(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUBRICEM_TEST_STRICT", raising=False)
    _write(pytester, "test_needs_a_module", "test_runs")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)
