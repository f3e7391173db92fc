"""Is the publisher under test speaking the wire profile it declared? Asked before any clause.

A publisher declared with the wrong profile (another encoding, schema
version or replay layout than it speaks) would fail clause after clause for
something that is not a defect. So before the suite judges anything, each
test session builds the publisher once, publishes a few batches, reads them
and one replay, and compares what arrived with the declared profile
(:mod:`reference_impl.kv_events.wire`):

- nothing the PUB socket sent decodes under the declared encoding and
  schema, or
- no replay answer is in the declared layout

is a *profile mismatch*: every test of the session is skipped with one
sentence naming the declared profile and, when one fits, the profile the
publisher speaks. Anything less clear-cut (no batch arrives, no replay
answer) is left to the clauses, which judge it.
"""

from __future__ import annotations

import contextlib
from typing import Final

from conformance.contracts.kv_events.publisher.peers import Rig, make_batch
from conformance.contracts.kv_events.spec import PublisherSpec
from reference_impl.kv_events.wire import (
    ENCODINGS,
    REPLAY_LAYOUTS,
    SCHEMAS,
    WireError,
    WireProfile,
    decode_payload,
    validate_payload,
)

__all__ = ["profile_mismatch"]

_PROBE_BATCHES: Final = 4
_cache: dict[tuple[str, WireProfile], str | None] = {}


def profile_mismatch(spec: PublisherSpec) -> str | None:
    """The mismatch sentence for ``spec``'s declared profile, or ``None`` (probed once)."""
    key = (spec.name, spec.profile)
    if key not in _cache:
        _cache[key] = _probe(spec)
    return _cache[key]


def _probe(spec: PublisherSpec) -> str | None:
    declared = spec.profile
    try:
        rig = Rig(spec, clause="the profile check")
    except Exception:
        return None  # a publisher that does not start is the clauses' to judge
    with rig:
        sub = rig.sub()
        try:
            rig.join(sub, timeout=3.0)
            for _ in range(_PROBE_BATCHES):
                rig.publish(make_batch())
            with contextlib.suppress(AssertionError):
                rig.wait_all(sub, timeout=2.0)
        except Exception:
            return None
        payloads = [message[2] for message in sub.got]
        client = rig.replay_client()
        client.request(0)
        with contextlib.suppress(AssertionError):
            client.read(clause="the profile check", timeout=1.5)
        layouts = {answer.layout for answer in client.answers}
    speaks_layout = next((layout for layout in REPLAY_LAYOUTS if layout in layouts), None)
    if payloads and not any(_decodes(p, declared) for p in payloads):
        speaks = _guess(payloads, declared)
        if speaks and speaks_layout and speaks_layout != declared.replay_layout:
            speaks = f"wire={speaks_layout} {speaks}"
        hint = f", {speaks}" if speaks else ""
        return (f"Profile mismatch: nothing this publisher sent decodes under "
                f"{declared.describe()}, so no clause is judged; declare the profile it "
                f"speaks{hint}.")
    if layouts and declared.replay_layout not in layouts:
        return (f"Profile mismatch: no replay answer of this publisher is in the declared "
                f"layout wire={declared.replay_layout}, so no clause is judged; declare the "
                f"profile it speaks (it answers in wire={speaks_layout}).")
    return None


def _decodes(payload: bytes, profile: WireProfile) -> bool:
    try:
        decode_payload(payload, profile)
    except WireError:
        return False
    return True


def _guess(payloads: list[bytes], declared: WireProfile) -> str | None:
    """The encoding and schema versions under which every payload is exact, if any.

    vLLM's versions are named before ``base`` (a vLLM batch that fits ``base``
    fits its own release too); several that fit are given as a range.
    """
    for encoding in ENCODINGS:
        fits = [name for name in SCHEMAS
                if all(validate_payload(p, WireProfile(declared.replay_layout, encoding, name))
                       is None for p in payloads)]
        named = [name for name in fits if name != "base"] or fits
        if named:
            schema = named[0] if len(named) == 1 else f"{named[0]} (any of {named[0]} to " \
                f"{named[-1]} fits what it sent)"
            return f"encoding={encoding} schema={schema}"
    return None
