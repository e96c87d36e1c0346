"""Issue 46, item 5: the Learning page, which every signed-in person may open, shows a failed retraining cycle as a
short message and a reference, never the exception text the cycle failed with (host names, paths).

Real parts: the page script through Streamlit's AppTest, a real SQLite store with the cycle recorded through the
registry, as the retraining pipeline records a failure.
"""

from __future__ import annotations

from collections.abc import Iterator

from streamlit.testing.v1 import AppTest

from app.container import Services
from app.settings import UIConfig
from store.registry import Registry
from tests.ui.test_ui_apptest import TIMEOUT, _learning_script
from tests.ui.test_ui_login_security import light  # noqa: F401 - fixture

RAW = ("OperationalError: could not connect to server: Connection refused; is the server running on host "
       "\"db-7.internal.example\" (10.2.3.4) and accepting connections on port 5432? "
       "(while reading /srv/rubricem/secret-data/runs/questions.jsonl)")


def _shown(at: AppTest) -> Iterator[str]:
    """Every text the page drew, tables included."""
    for kind in ("markdown", "caption", "info", "error", "warning", "success", "title", "subheader", "metric"):
        for element in getattr(at, kind):
            yield str(element.value)
    for table in at.dataframe:
        yield table.value.to_string()


def test_a_failed_cycle_shows_a_reference_not_its_exception_text(light: object) -> None:  # noqa: F811
    svc: Services = light(UIConfig())  # type: ignore[operator]
    registry = Registry(svc.log)
    cycle = registry.start_cycle("scheduler", svc.log.now())
    registry.finish_cycle(cycle.cycle_id, "failed", error=RAW)

    page = AppTest.from_function(_learning_script, default_timeout=TIMEOUT)
    page.session_state["user_id"], page.session_state["role"] = "bob", "user"  # any signed-in person
    page.run()
    assert not page.exception, page.exception
    text = "\n".join(_shown(page))
    for secret in ("db-7.internal.example", "10.2.3.4", "/srv/rubricem", "OperationalError", "5432"):
        assert secret not in text
    (table,) = [t.value for t in page.dataframe if "reason" in t.value.columns and "trigger" in t.value.columns]
    (reason,) = table["reason"].tolist()
    assert cycle.cycle_id in reason and "error reference" in reason
    # The operator still has the whole text where only the operator looks: the registry (`rubricem versions`).
    assert registry.cycle(cycle.cycle_id).error == RAW
