"""Defects planted in the reference transport that the catalog does not model.

:mod:`conformance.contracts.p2p.transports` is the official mutant catalog; the
stateful machines' own proof (``tests/test_machines_find_defects.py``) reuses
it and adds only what it lacks here, in the same style: one small subclass,
the defect marked ``# MUTATION``.
"""

from __future__ import annotations

from typing import Any

from reference_impl.p2p.transport import ZmqConnection, ZmqTransport, parse_routing_id

__all__ = ["DropsFirstMessageAfterRestart"]


class DropsFirstMessageAfterRestart(ZmqTransport):
    """A "stale session" filter: after a peer's connection died (the peer went away,
    e.g. restarted), the first message from that peer is taken for a leftover of
    the old session and dropped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lost_peers: set[str] = set()

    def poll(self) -> list[ZmqConnection]:
        for conn in list(self._connections.values()):
            was_alive = conn._alive
            conn._drain_monitor()
            if was_alive and not conn._alive:
                self._lost_peers.add(conn.peer_id)
        return super().poll()

    def _route(self, frames: list[bytes], new: list[ZmqConnection]) -> None:
        if len(frames) == 2:
            try:
                peer_id = parse_routing_id(frames[0])[0]  # the reference's tag split off
            except ValueError:
                peer_id = ""
            if peer_id in self._lost_peers:
                self._lost_peers.discard(peer_id)
                return  # MUTATION: the first message after the peer came back vanishes
        super()._route(frames, new)

