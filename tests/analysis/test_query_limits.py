"""An analyst's query has bounds: memory (`PADDOCK_QUERY_MEMORY_MB`, default a quarter of the
machine's, at most 8 GiB) and time (`PADDOCK_QUERY_TIMEOUT_S`, default 600 s): a runaway query
on a shared login node is stopped with a clear error, and the settings cannot be changed by SQL
(the configuration is locked). Runs are real (tests/analysis/test_query_readonly.py's `run`)."""
from __future__ import annotations

import pytest

from controller.analysis.query import QueryError, execute
from tests.analysis.test_export import policy  # noqa: F401 - the fixture is used by name
from tests.analysis.test_query_readonly import run  # noqa: F401 - the fixture is used by name


def test_a_query_past_its_time_limit_is_stopped_with_a_clear_error(run, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setenv("PADDOCK_QUERY_TIMEOUT_S", "0.5")
    with pytest.raises(QueryError, match=r"ran past 0.5 s .*PADDOCK_QUERY_TIMEOUT_S"):
        execute(run, "SELECT count(*) FROM range(1000000000000) a, range(1000) b WHERE a.range % 7 = b.range")
    assert execute(run, "SELECT count(*) FROM rollouts")[1][0][0] == 3, "the next query runs"


def test_the_memory_limit_is_set_and_sql_cannot_raise_it(run, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setenv("PADDOCK_QUERY_MEMORY_MB", "300")
    (limit,), = execute(run, "SELECT current_setting('memory_limit')")[1]
    assert limit.replace(" ", "").upper() in ("300.0MIB", "300MB", "286.1MIB"), limit
    with pytest.raises(QueryError):
        execute(run, "SET memory_limit = '100GB'")
    monkeypatch.delenv("PADDOCK_QUERY_MEMORY_MB")
    (limit,), = execute(run, "SELECT current_setting('memory_limit')")[1]
    assert "GiB" in limit or "MiB" in limit


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "lots"])
def test_a_bad_limit_setting_is_named(run, monkeypatch, raw):  # noqa: F811 - the fixture
    monkeypatch.setenv("PADDOCK_QUERY_TIMEOUT_S", raw)
    with pytest.raises(QueryError, match="PADDOCK_QUERY_TIMEOUT_S must be a positive number"):
        execute(run, "SELECT 1")
