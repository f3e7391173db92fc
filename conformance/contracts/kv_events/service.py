"""The Python driver's side of both KV-event contracts: Python publishers and subscribers
served over the protocol.

``python -m conformance.drivers.python MODULE:ATTR`` serves a KV-event
implementation through :class:`PublisherService` or
:class:`SubscriberService` (the registry's ``python_service``): each request
of ``docs/drivers.md``, section 6, becomes one call of the Python objects.
Batches arrive in their map form and are converted to
:class:`~reference_impl.kv_events.schema.KVEventBatch` before the call (the
conversion is the driver's time, left out of ``elapsed_ns``). The bursts
(``publish_many``, ``publish_copies``, ``publish_copies_timed``,
``publish_then_shutdown``) run here, back to back, as a loop in-process
would. The suite's side, the proxies, is :mod:`conformance.contracts.kv_events.driver`.

This module runs in every driver process: it imports only the protocol's
serving helpers and the reference's schema, never the suite.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final

import msgspec

from conformance.drivers.serving import (
    Refused,
    Service,
    accepts,
    declared,
    let_waiting_threads_run,
    stats_of,
)
from reference_impl.kv_events.publisher import PublisherClosedError
from reference_impl.kv_events.schema import KVEventBatch

__all__ = [
    "PUBLISHER_OPTIONS",
    "SUBSCRIBER_OPTIONS",
    "PublisherService",
    "SubscriberService",
    "publish_copies_in_driver",
    "publish_copies_timed_in_driver",
    "publish_many_in_driver",
    "publish_then_shutdown_in_driver",
]

#: Keyword arguments a publisher driver may list in ``options``.
PUBLISHER_OPTIONS: Final = (
    "buffer_steps", "max_queue", "shutdown_timeout_ms", "replay_stall_timeout_ms",
    "data_parallel_rank", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
    "curve_server_secret_key", "curve_allowed_client_keys",
)
#: Keyword arguments a subscriber driver may list in ``options``.
SUBSCRIBER_OPTIONS: Final = ("replay_timeout_ms", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
                              "curve_client_secret_key", "curve_server_key")
_BYTES: Final = (bytes, bytearray, memoryview)


class _KVService(Service):
    """A KV-event factory ``factory(endpoint, replay_endpoint, *, topic, **options)``."""

    constructor: ClassVar[str] = ""
    known_options: ClassVar[tuple[str, ...]] = ()

    def hello(self) -> dict[str, Any]:
        answer = super().hello()
        answer["capabilities"] = declared(self.target)
        answer["options"] = [o for o in self.known_options if accepts(self.target, o)]
        return answer

    def _make(self, args: dict[str, Any]) -> tuple[Any, str, str]:
        endpoint, replay = args.pop("endpoint"), args.pop("replay_endpoint")
        return self.target(endpoint, replay, **args), endpoint, replay


class PublisherService(_KVService):
    """The Python driver's side of ``kv-events-publisher``."""

    constructors = ("publisher",)
    known_options = PUBLISHER_OPTIONS
    declared_calls = ("publish_copies_timed",)
    error_kinds = ((PublisherClosedError, "closed"),)

    def _construct_publisher(self, args: dict[str, Any]) -> Any:
        obj, endpoint, replay = self._make(args)
        return {"handle": self.new("publisher", obj),
                "endpoint": str(getattr(obj, "endpoint", endpoint)),
                "replay_endpoint": str(getattr(obj, "replay_endpoint", replay))}

    def _publisher_publish(self, obj: Any, batch: Any) -> None:
        started = time.perf_counter_ns()
        try:
            typed = _as_batch(batch)
        finally:
            self.overhead_ns += time.perf_counter_ns() - started
        obj.publish(typed)

    # publish_many, publish_copies (docs/drivers.md, section 6): a burst runs here, back to back.

    def _publisher_publish_many(self, obj: Any, batches: list[Any]) -> Any:
        outcomes, overhead_ns = publish_many_in_driver(obj, batches, _as_batch, self.error)
        self.overhead_ns += overhead_ns
        return outcomes

    def _publisher_publish_copies(self, obj: Any, batch: Any, count: int) -> Any:
        outcomes, overhead_ns = publish_copies_in_driver(obj, batch, count, _as_batch,
                                                         self.error)
        self.overhead_ns += overhead_ns
        return outcomes

    def _publisher_publish_copies_timed(self, obj: Any, batch: Any, count: int) -> Any:
        result, overhead_ns = publish_copies_timed_in_driver(obj, batch, count, _as_batch,
                                                             self.error)
        self.overhead_ns += overhead_ns
        return result

    def _publisher_publish_then_shutdown(self, obj: Any, batches: list[Any]) -> Any:
        result, overhead_ns = publish_then_shutdown_in_driver(obj, batches, _as_batch,
                                                              self.error)
        self.overhead_ns += overhead_ns
        return result

    def _publisher_shutdown(self, obj: Any) -> None:
        obj.shutdown()

    def _publisher_stats(self, obj: Any) -> Any:
        return stats_of(obj)


class SubscriberService(_KVService):
    """The Python driver's side of ``kv-events-subscriber``."""

    constructors = ("subscriber",)
    known_options = SUBSCRIBER_OPTIONS

    def _construct_subscriber(self, args: dict[str, Any]) -> Any:
        obj, _, _ = self._make(args)
        return {"handle": self.new("subscriber", obj)}

    def _subscriber_poll(self, obj: Any, timeout_ms: int) -> Any:
        got = obj.poll(timeout_ms)
        started = time.perf_counter_ns()
        try:
            return [[seq, msgspec.to_builtins(batch, builtin_types=_BYTES)] for seq, batch in got]
        finally:
            self.overhead_ns += time.perf_counter_ns() - started

    def _subscriber_close(self, obj: Any) -> None:
        obj.close()

    def _subscriber_stats(self, obj: Any) -> Any:
        return stats_of(obj)


def _as_batch(batch: Any) -> Any:
    try:
        return msgspec.convert(batch, KVEventBatch)
    except msgspec.ValidationError as exc:
        raise Refused("invalid", f"not a KVEventBatch: {exc}") from None


# -- the bursts (docs/drivers.md, section 6) -----------------------------------------


def publish_many_in_driver(publisher: Any, batches: Sequence[Any],
                           convert: Callable[[Any], Any],
                           error_map: Callable[[BaseException], dict[str, Any]]
                           ) -> tuple[list[dict[str, Any] | None], int]:
    """The Python driver's ``publish_many``: convert every batch first (``convert``),
    then call ``publisher.publish`` for each, back to back, as one loop in-process
    would. Returns the outcomes (``None``, or the error map of what that call raised)
    and the nanoseconds spent converting, which ``elapsed_ns`` leaves out."""
    started = time.perf_counter_ns()
    typed: list[Any] = []
    for batch in batches:
        try:
            typed.append(convert(batch))
        except Exception as exc:  # its publish() is refused; the others still run
            typed.append(exc)
    # The conversion held the interpreter lock for milliseconds (a 600 KB batch takes
    # ~8 ms to decode and convert): the publisher's thread, woken by the last burst,
    # waits for it, and would take it from the first timed publish() below (EVT-3 saw
    # 2-13 ms in the first call of nearly every run of ten, about 1 us in the others).
    let_waiting_threads_run()
    overhead = time.perf_counter_ns() - started
    outcomes: list[dict[str, Any] | None] = []
    for batch in typed:
        if isinstance(batch, Exception):
            outcomes.append(error_map(batch))
            continue
        try:
            publisher.publish(batch)
        except Exception as exc:
            outcomes.append(error_map(exc))
        else:
            outcomes.append(None)
    return outcomes, overhead


def publish_copies_in_driver(publisher: Any, batch: Any, count: int,
                             convert: Callable[[Any], Any],
                             error_map: Callable[[BaseException], dict[str, Any]]
                             ) -> tuple[list[dict[str, Any] | None], int]:
    """The Python driver's ``publish_copies``: ``count`` copies of the converted batch,
    copy ``k`` with ``ts + k`` (sharing everything else, as copies made in-process
    with ``msgspec.structs.replace`` do), then published back to back."""
    started = time.perf_counter_ns()
    typed = convert(batch)
    copies = [msgspec.structs.replace(typed, ts=typed.ts + k) for k in range(count)]
    overhead = time.perf_counter_ns() - started
    outcomes, more = publish_many_in_driver(publisher, copies, lambda copy: copy, error_map)
    return outcomes, overhead + more


def publish_copies_timed_in_driver(publisher: Any, batch: Any, count: int,
                                   convert: Callable[[Any], Any],
                                   error_map: Callable[[BaseException], dict[str, Any]]
                                   ) -> tuple[dict[str, Any], int]:
    """The Python driver's ``publish_copies_timed``: ``count`` copies of the converted
    batch (made first, as :func:`publish_copies_in_driver` makes them), then published
    back to back, each call timed on its own. Returns the result map (``outcomes``,
    ``elapsed_ns`` per call) and the nanoseconds spent outside the calls."""
    began = time.perf_counter_ns()
    typed = convert(batch)
    copies = [msgspec.structs.replace(typed, ts=typed.ts + k) for k in range(count)]
    let_waiting_threads_run()  # see publish_many_in_driver: the decoding held the lock
    outcomes: list[dict[str, Any] | None] = []
    elapsed: list[int] = []
    inside = 0
    for copy in copies:
        started = time.perf_counter_ns()
        try:
            publisher.publish(copy)
        except Exception as exc:
            took = time.perf_counter_ns() - started
            outcomes.append(error_map(exc))
        else:
            took = time.perf_counter_ns() - started
            outcomes.append(None)
        elapsed.append(took)
        inside += took
    overhead = max(0, time.perf_counter_ns() - began - inside)
    return {"outcomes": outcomes, "elapsed_ns": elapsed}, overhead


def publish_then_shutdown_in_driver(publisher: Any, batches: Sequence[Any],
                                    convert: Callable[[Any], Any],
                                    error_map: Callable[[BaseException], dict[str, Any]]
                                    ) -> tuple[dict[str, Any], int]:
    """The Python driver's ``publish_then_shutdown``: :func:`publish_many_in_driver`, then
    ``stats()`` (when the publisher has one), then ``shutdown()``, back to back. Returns
    the result map and the nanoseconds spent converting."""
    began = time.perf_counter_ns()
    outcomes, overhead = publish_many_in_driver(publisher, batches, convert, error_map)
    published = time.perf_counter_ns()
    stats = getattr(publisher, "stats", None)
    got = stats() if callable(stats) else None
    before = ({str(k): v for k, v in dict(got).items()} if isinstance(got, Mapping)
              else None)
    started = time.perf_counter_ns()
    publisher.shutdown()
    ended = time.perf_counter_ns()
    return {"outcomes": outcomes, "stats": before,
            "publish_ns": max(0, published - began - overhead),
            "shutdown_ns": ended - started}, overhead
