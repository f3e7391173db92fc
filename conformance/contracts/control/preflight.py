"""Before any clause is judged: does the server under test speak the declared wire profile?

A server declared with the wrong profile would otherwise fail every server
clause with "no reply" or undecodable replies, which reads like a missing
handler. So once per session, in the xdist controller, the suite starts the
server, sends it the declared request types under the declared profile and
looks at what comes back:

- something decodes under the declared profile: go on (the clauses judge
  the rest, including missing handlers);
- otherwise a fresh server instance is asked under each other profile (a
  fresh one, because a server may die of frames it cannot parse); one that
  answers under another profile is a mismatch naming that profile;
- replies that decode under no profile are a mismatch too; silence under
  every profile is left to the clauses ("no reply").

A mismatch ends the run as a usage error: :class:`ConfigError` with "nothing
this server answered decodes under profile X: declare the profile it speaks".
"""

from __future__ import annotations

import contextlib
import time
from typing import Final

import zmq

from conformance.contracts.control.harness import Rig
from conformance.contracts.control.spec import ControlSpec
from conformance.contracts.control.wire import PROFILES, WireProfile
from conformance.errors import CallBlocked, ConfigError

__all__ = ["check_profile"]

#: How long one probe listens for replies (an idle server answers in milliseconds).
_LISTEN_S: Final = 1.0


def check_profile(spec: ControlSpec) -> None:
    """Raise :class:`ConfigError` when the server under test does not speak its declared
    profile (see the module docstring); a client-only implementation is not probed."""
    if spec.server is None:
        return
    declared = spec.profile
    answered = _probe(spec, declared)
    if answered is None:
        return  # the server could not be started: the clauses report that
    if any(declared.read(frames) is not None for frames in answered):
        return
    for other in PROFILES.values():
        if other is declared:
            continue
        replies = _probe(spec, other) or []
        if any(other.read(frames) is not None for frames in replies):
            raise ConfigError(_mismatch(spec, declared, [other.name],
                                        answered[0] if answered else replies[0]))
    if answered:
        raise ConfigError(_mismatch(spec, declared, [], answered[0]))


def _mismatch(spec: ControlSpec, declared: WireProfile, speaks: list[str],
              sample: list[bytes]) -> str:
    hint = (f"it answers under {speaks[0]}: declare --capability wire={speaks[0]}" if speaks
            else "declare the profile it speaks with --capability wire=NAME (known: "
            f"{', '.join(PROFILES)})")
    return (f"control: nothing {spec.name} answered decodes under wire profile "
            f"{declared.name} ({declared.summary}); first reply {sample!r:.120}; {hint}")


def _probe(spec: ControlSpec, profile: WireProfile) -> list[list[bytes]] | None:
    """Start a server, send the declared request types under ``profile``, return every
    message that came back (None when the server could not be started)."""
    caps = spec.capabilities
    with Rig(spec, clause="CTL-1") as rig:
        try:
            rig.start_server()
        except (CallBlocked, Exception):
            return None
        peer = rig.wire()
        answered: list[list[bytes]] = []
        codes = caps.codes()
        for rid, (kind, body) in enumerate(caps.request_types.items(), start=1):
            with contextlib.suppress(ConfigError, zmq.ZMQError):
                peer.sock.send_multipart(profile.request(rid, kind, dict(body), codes),
                                         zmq.NOBLOCK)
        deadline = time.monotonic() + _LISTEN_S
        while time.monotonic() < deadline and len(answered) < len(caps.request_types):
            frames = peer.sock.recv_multipart() if peer.sock.poll(20) else None
            if frames is not None:
                answered.append(frames)
            elif rig.runner is not None and rig.runner.dead_loop() is not None:
                break
        _quiet_stop(rig)
    return answered


def _quiet_stop(rig: Rig) -> None:
    """Stop the probe's server without reporting its loop's death (that is the clauses' job)."""
    runner, rig.runner = rig.runner, None
    if runner is not None:
        with contextlib.suppress(Exception):
            runner.stop()
