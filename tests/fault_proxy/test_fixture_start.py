"""A fault proxy that cannot start never lets the chaos clauses pass by skipping.

Pure logic (the server's start is replaced): what the worker's fixture does
with :class:`chaos.launcher.ToxiproxyUnavailable`.
"""

from __future__ import annotations

import pytest

from chaos import fixtures
from chaos.launcher import ENV_SERVER, ENV_URL, ToxiproxyUnavailable
from chaos.proxy import Toxiproxy
from conformance.errors import RunError, is_run_error


def _unavailable() -> Toxiproxy:
    raise ToxiproxyUnavailable("embedded toxiproxy server did not answer GET /version within 15 s")


def test_an_embedded_server_that_does_not_start_is_a_run_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setattr(Toxiproxy, "start", staticmethod(_unavailable))
    with pytest.raises(RunError) as info:
        fixtures.start_or_stop_the_test()
    reason = str(info.value.msg)
    assert is_run_error(reason), reason
    assert "no chaos test ran" in reason and "GET /version" in reason


def test_a_requested_server_that_does_not_start_fails_the_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_SERVER, "/nonexistent/toxiproxy-server")
    monkeypatch.setattr(Toxiproxy, "start", staticmethod(_unavailable))
    with pytest.raises(pytest.fail.Exception, match="GET /version"):
        fixtures.start_or_stop_the_test()
