"""Before any clause is judged: does the server under test speak the declared wire profile?

A server declared with the wrong profile would otherwise fail every server
clause with "no reply" or undecodable replies, which reads like a missing
handler. So once per session, in the xdist controller, the suite starts the
server, sends it the declared request types under the declared profile and
looks at what comes back:

- a declared type succeeds under the declared profile: go on (the clauses
  judge the rest, including missing handlers);
- otherwise a fresh server instance is asked under each other profile (a
  fresh one, because a server may die of frames it cannot parse), in that
  profile's own terms (its default codes and PING arguments, the declared
  codes valid there); one where a declared type *succeeds* is a mismatch
  naming that profile. Success, not decoding, is the test: the positional
  profiles share their error reply (``[id, code]``), so a correct LMCache
  0.4 server asked LMCache 0.5's operation names answers errors that decode
  under both, and only success tells which wire it speaks;
- replies that decode under no profile are a mismatch too; errors and
  silence under every profile are left to the clauses (a missing PING
  handler fails CTL-1, "no reply").

A mismatch ends the run as a usage error: :class:`ConfigError` with "nothing
this server answered decodes (or succeeds) under profile X: declare the
profile it speaks".
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Final

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
    if _succeeded(spec, declared, answered):
        return
    for other in PROFILES.values():
        if other is declared:
            continue
        replies = _probe(spec, other) or []
        if _succeeded(spec, other, replies):
            raise ConfigError(_mismatch(spec, declared, [other.name], answered))
    if answered and not any(declared.read(frames) is not None for frames in answered):
        raise ConfigError(_mismatch(spec, declared, [], answered))


def _succeeded(spec: ControlSpec, profile: WireProfile, replies: list[list[bytes]]) -> bool:
    """Whether a reply reads as a success under ``profile`` (any declared result type: the
    result's type is CTL-1's question)."""
    for frames in replies:
        reply = profile.read(frames)
        if reply is not None and profile.success_problem(reply) is None:
            return True
    return False


def _requests(spec: ControlSpec, profile: WireProfile) -> list[tuple[str, dict[str, Any]]]:
    """The declared types as ``profile`` asks them: under the declared profile the declared
    bodies; under another, PING with that profile's own arguments."""
    from reference_impl.control.wire import LMCACHE_05, PING_BODY_05

    types = [(kind, dict(body)) for kind, body in spec.capabilities.request_types.items()]
    if profile is spec.profile:
        return types
    ping = dict(PING_BODY_05) if profile.name == LMCACHE_05 else {}
    return [(kind, ping if kind == "PING" else body) for kind, body in types]


def _mismatch(spec: ControlSpec, declared: WireProfile, speaks: list[str],
              answered: list[list[bytes]]) -> str:
    """One line: what the declared profile got (a sample), and what to declare."""
    hint = (f"it answers under {speaks[0]}: declare --capability wire={speaks[0]}" if speaks
            else "declare the profile it speaks with --capability wire=NAME (known: "
            f"{', '.join(PROFILES)})")
    if not answered:
        what, sample = f"{spec.name} answered nothing", ""
    elif any(declared.read(frames) is not None for frames in answered):
        what = f"nothing {spec.name} answered succeeds (only error replies)"
        sample = f"; first reply {answered[0]!r:.120}"
    else:
        what = f"nothing {spec.name} answered decodes"
        sample = f"; first reply {answered[0]!r:.120}"
    return (f"control: {what} under wire profile {declared.name} ({declared.summary})"
            f"{sample}; {hint}")


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
        codes = caps.codes(profile.name)
        requests = _requests(spec, profile)
        for rid, (kind, body) in enumerate(requests, start=1):
            with contextlib.suppress(ConfigError, zmq.ZMQError):
                peer.sock.send_multipart(profile.request(rid, kind, body, codes), zmq.NOBLOCK)
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
