"""``benchmarks.proxy_cpu`` measures what it says, on a small scale (the real figures
are in docs/chaos.md, "Fault proxy CPU")."""

from __future__ import annotations

import pytest

from benchmarks import proxy_cpu
from chaos.launcher import ENV_SERVER, ENV_URL

pytestmark = pytest.mark.chaos


def test_proxy_cpu_reports_every_figure_from_real_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.delenv(ENV_SERVER, raising=False)
    monkeypatch.setattr(proxy_cpu, "API_ROUNDS", 5)
    monkeypatch.setattr(proxy_cpu, "ROUND_TRIPS", 50)
    result = proxy_cpu.run(repeats=1, progress=lambda line: None)
    median = result["median"]
    assert set(median) == {
        "start_server_cpu_ms", "start_wall_ms", "api_client_cpu_us_per_call",
        "api_server_cpu_us_per_call", "relay_no_toxic_server_cpu_us_per_round_trip",
        "relay_latency_1ms_server_cpu_us_per_round_trip",
    }
    # A server's start is an interpreter's: some CPU, never none; a call costs the client.
    assert median["start_server_cpu_ms"] > 0 and median["start_wall_ms"] > 0
    assert median["api_client_cpu_us_per_call"] > 0
    assert all(value >= 0 for value in median.values())
