"""A fault proxy that cannot start never lets the chaos clauses pass by skipping.

The first tests are pure logic (the server's start is replaced): what the
worker's fixture does with :class:`chaos.launcher.ToxiproxyUnavailable`. The
others start real embedded servers early, as the plugin does during
collection (:class:`chaos.launcher.Launch`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import pytest

from chaos import fixtures, launcher
from chaos.launcher import ENV_SERVER, ENV_URL, Launch, ToxiproxyUnavailable
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


# -- the early start (chaos.launcher.Launch, the plugin's collection hooks) ----------


class _Option:
    collectonly = False


class _Config:
    option = _Option()


class _Item:
    """What the collection hooks read of a test item."""

    config = _Config()

    def __init__(self, *fixturenames: str) -> None:
        self.fixturenames = fixturenames


class _Session:
    def __init__(self, *items: _Item) -> None:
        self.items = list(items)


def _collected(*fixturenames: str) -> None:
    fixtures.pytest_itemcollected(cast(pytest.Item, _Item(*fixturenames)))


def _finished(*items: _Item) -> None:
    fixtures.pytest_collection_finish(cast(pytest.Session, _Session(*items)))


def _early() -> Launch | None:
    return fixtures._early


def _embedded_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setenv("PATH", "")  # no toxiproxy-server binary either


def test_a_server_spawned_early_is_claimed_by_the_fixture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first collected chaos test spawns the server; the fixture gets that one."""
    _embedded_only(monkeypatch)
    monkeypatch.setattr(fixtures, "_early", None)
    _collected("request")
    assert _early() is None  # no chaos test yet: nothing started
    _collected("toxiproxy", "request")
    early = _early()
    assert isinstance(early, Launch)
    _collected("toxiproxy")
    assert _early() is early  # one per worker
    _finished(_Item("toxiproxy"))
    assert _early() is early  # a selected test uses it: kept
    handle = fixtures.start_or_stop_the_test()
    try:
        assert _early() is None
        assert handle.kind == "embedded" and handle.version()
        assert handle.lease is not None and handle.lease.process is not None
    finally:
        handle.stop()


def test_a_server_spawned_early_for_deselected_tests_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _embedded_only(monkeypatch)
    monkeypatch.setattr(fixtures, "_early", None)
    _collected("toxiproxy")
    early = _early()
    assert early is not None and early._spawned is not None
    process = early._spawned[0].process
    assert process is not None
    _finished(_Item("request"))
    assert _early() is None
    assert process.poll() is not None  # stopped, not left for the atexit hook


def test_collect_only_starts_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    _embedded_only(monkeypatch)
    monkeypatch.setattr(fixtures, "_early", None)
    item = _Item("toxiproxy")
    monkeypatch.setattr(item, "config", type("C", (), {"option": type("O", (), {
        "collectonly": True})()})())
    fixtures.pytest_itemcollected(cast(pytest.Item, item))
    assert _early() is None


def test_an_early_start_that_cannot_start_fails_where_the_fixture_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad setting is not raised during collection: the fixture reports it as before."""
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_SERVER, "/nonexistent/toxiproxy-server")
    monkeypatch.setattr(fixtures, "_early", None)
    _collected("toxiproxy")
    assert _early() is not None
    with pytest.raises(pytest.fail.Exception, match="TOXIPROXY_SERVER"):
        fixtures.start_or_stop_the_test()


def test_an_early_start_counts_the_servers_time_from_its_spawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server asked for long after its spawn is ready at once, not timed out: the
    limit is the server's own start-up time, and it answered."""
    _embedded_only(monkeypatch)
    monkeypatch.setattr(launcher, "_START_TIMEOUT_S", 3.0)
    early = Launch("embedded")
    spawned = early._spawned
    assert spawned is not None
    lease = spawned[0]
    deadline = time.monotonic() + 60
    while not lease.log_path or not _port_written(spawned[1]):
        assert time.monotonic() < deadline, "the embedded server never wrote its port"
        time.sleep(0.05)
    time.sleep(3.5)  # past the limit in wall time since the spawn
    ready = early.ready()
    try:
        assert ready is lease and ready.port > 0
    finally:
        ready.stop()


def _port_written(path: Path) -> bool:
    try:
        return int(path.read_text(encoding="ascii").strip()) > 0
    except (OSError, ValueError):
        return False
