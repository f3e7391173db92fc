"""Does the subscriber under test read the payload encoding it declared? Asked before any clause.

The suite's publisher speaks the subscriber's declared encoding and schema.
A subscriber declared with the wrong encoding would deliver nothing, and
every clause would fail on timeouts for a line of configuration. So each
session first publishes a few batches in the declared profile; if none is
delivered, it tries the other encodings, and if one of those is delivered
the session is a *profile mismatch*: every test is skipped with one
sentence naming the declared encoding and the one the subscriber reads. A
subscriber that reads nothing at all is left to the clauses.
"""

from __future__ import annotations

import contextlib
from typing import Final

from conformance.contracts.kv_events.subscriber.peer import Session, SubscriberSpec
from reference_impl.kv_events.wire import ENCODINGS, WireEncoding

__all__ = ["profile_mismatch"]

_PROBE_BATCHES: Final = 3
_cache: dict[tuple[str, str, str], str | None] = {}


def profile_mismatch(spec: SubscriberSpec) -> str | None:
    """The mismatch sentence for ``spec``'s declared encoding, or ``None`` (probed once)."""
    key = (spec.name, spec.encoding, spec.schema)
    if key not in _cache:
        _cache[key] = _probe(spec)
    return _cache[key]


def _probe(spec: SubscriberSpec) -> str | None:
    declared = spec.encoding
    for encoding in (declared, *(e for e in ENCODINGS if e != declared)):
        delivered = _delivers(spec, encoding)
        if delivered is None:
            return None  # the subscriber does not start or subscribe: the clauses judge
        if delivered:
            if encoding == declared:
                return None
            return (f"Profile mismatch: the subscriber delivered none of the batches the "
                    f"suite sent in encoding={declared} schema={spec.schema}, so no clause "
                    f"is judged; declare the profile it reads (it reads encoding={encoding}).")
    return None


def _delivers(spec: SubscriberSpec, encoding: WireEncoding) -> bool | None:
    """Whether batches in ``encoding`` reach the application; ``None``: no verdict."""
    try:
        session = Session(spec, clause="the profile check")
    except Exception:
        return None
    with session as s:
        s.fake.encoding = encoding
        try:
            s.subscribed(timeout=3.0)
            for _ in range(_PROBE_BATCHES):
                s.fake.publish()
            with contextlib.suppress(AssertionError):
                s.drive_until(lambda: bool(s.delivered), timeout=1.5,
                              what="a batch delivered")
        except Exception:
            return None
        return bool(s.delivered)
