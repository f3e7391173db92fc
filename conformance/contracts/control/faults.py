"""Faults on the control channel: one toxiproxy proxy in front of the server.

:class:`ChaosRig` is a :class:`~conformance.contracts.control.harness.Rig`
whose clients reach the server only through a proxy, so a fault on that
proxy hits every connection of every client, and a restarted server sits
behind the same proxy. Faults follow ``conformance.contracts.p2p.faults`` (toxiproxy 2.x
semantics): a *partition* is a ``timeout`` toxic (no byte passes, nothing
is closed) plus a ``slow_close`` that holds back closes, on both streams;
healing it closes the connections it held. ``latency`` delays every byte,
``reset`` resets connections as soon as data flows, ``disable`` closes them
and refuses new ones. ``started_at``/``in_place_at`` bracket the API calls,
so bounds never charge their duration to the implementation. Closing the
rig heals everything and deletes the proxy.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Literal

from chaos.proxy import Proxy, ToxicType, Toxiproxy, ToxiproxyError
from conformance.contracts.control.harness import Rig, ServerRunner
from conformance.contracts.control.spec import ControlSpec
from conformance.testing.net import HOST

Kind = Literal["partition", "latency", "reset", "disable"]
_HOLD_CLOSE_MS = 600_000
_serial = itertools.count(1)


@dataclass
class Fault:
    kind: Kind
    started_at: float
    in_place_at: float = 0.0
    healed_at: float | None = None
    toxics: list[str] = field(default_factory=list)
    disabled: bool = False


class ChaosRig(Rig):
    """A rig whose clients connect through a toxiproxy proxy in front of the server."""

    def __init__(self, spec: ControlSpec, toxiproxy: Toxiproxy) -> None:
        super().__init__(spec)
        self.toxiproxy = toxiproxy
        self.proxy: Proxy | None = None
        self.active: list[Fault] = []

    def reserve_port(self) -> str:
        super().reserve_port()
        if self.proxy is None:
            self.proxy = self.toxiproxy.create_proxy(
                self.toxiproxy.unique_name("ctl_server"), upstream=f"{HOST}:{self.port}",
                listen=f"{HOST}:0")
            self.client_endpoint = f"tcp://{self.proxy.listen}"
        return self.client_endpoint

    def start_server(self) -> ServerRunner:
        self.reserve_port()
        return super().start_server()

    # -- faults -----------------------------------------------------------------

    def partition(self) -> Fault:
        fault = self._toxics("partition", "timeout", timeout=0)
        self._add(fault, "slow_close", delay=_HOLD_CLOSE_MS)
        fault.in_place_at = time.monotonic()
        return fault

    def latency(self, latency_ms: int, jitter_ms: int = 0) -> Fault:
        return self._toxics("latency", "latency", latency=latency_ms, jitter=jitter_ms)

    def reset(self) -> Fault:
        return self._toxics("reset", "reset_peer", timeout=0)

    def disable(self) -> Fault:
        assert self.proxy is not None
        fault = Fault("disable", time.monotonic())
        self.active.append(fault)
        self.proxy.disable()
        fault.disabled = True
        fault.in_place_at = time.monotonic()
        return fault

    def heal(self, fault: Fault) -> float:
        """Remove ``fault`` (idempotent); returns when it was healed."""
        if fault.healed_at is not None:
            return fault.healed_at
        assert self.proxy is not None
        errors: list[ToxiproxyError] = []
        for name in reversed(fault.toxics):
            try:
                self.proxy.remove_toxic(name)
            except ToxiproxyError as exc:
                errors.append(exc)
        if fault.disabled:
            self.proxy.enable()
        fault.healed_at = time.monotonic()
        self.active.remove(fault)
        if errors:
            raise errors[0]
        return fault.healed_at

    def heal_all(self) -> None:
        for fault in reversed(list(self.active)):
            self.heal(fault)

    def _toxics(self, kind: Kind, toxic: ToxicType, **attributes: int) -> Fault:
        fault = Fault(kind, time.monotonic())
        self.active.append(fault)
        self._add(fault, toxic, **attributes)
        fault.in_place_at = time.monotonic()
        return fault

    def _add(self, fault: Fault, toxic: ToxicType, **attributes: int) -> None:
        assert self.proxy is not None
        number = next(_serial)
        for stream in ("upstream", "downstream"):
            name = f"ctl_{toxic}_{stream}_{number}"
            self.proxy.add_toxic(toxic, stream=stream, name=name, **attributes)
            fault.toxics.append(name)

    def close(self) -> None:
        try:
            self.heal_all()
        finally:
            try:
                super().close()
            finally:
                if self.proxy is not None:
                    self.proxy.destroy()
