"""Both KV-event contracts through a driver: publisher and subscriber proxies.

The suites hand a publisher :class:`~reference_impl.kv_events.schema.KVEventBatch`
objects and compare a subscriber's batches field by field after
:func:`~reference_impl.kv_events.schema.normalize`. A batch crosses the
protocol in its map form (``msgspec.to_builtins``: events tagged by
``type``), and a subscriber's batches come back as the driver sent them
(map or array form), which ``normalize`` reads. Calls follow
``docs/drivers.md``, section 6.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final

import msgspec

from conformance.drivers.process import DriverCrashed, DriverReplyError
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature, to_exception
from conformance.drivers.serving import (
    Refused,
    Service,
    accepts,
    declared,
    let_waiting_threads_run,
    stats_of,
)
from conformance.supervision import watchdog
from reference_impl.kv_events.publisher import PublisherClosedError
from reference_impl.kv_events.schema import KVEventBatch, SchemaError, normalize

__all__ = [
    "PUBLISHER_OPTIONS",
    "SUBSCRIBER_OPTIONS",
    "DriverPublisher",
    "DriverSubscriber",
    "PublisherFactory",
    "PublisherService",
    "SubscriberFactory",
    "SubscriberService",
    "publish_copies_in_driver",
    "publish_copies_timed_in_driver",
    "publish_many_in_driver",
    "publish_then_shutdown_in_driver",
]

PUBLISHER: Final = "kv-events-publisher"
SUBSCRIBER: Final = "kv-events-subscriber"
#: Keyword arguments a publisher driver may list in ``options``.
PUBLISHER_OPTIONS: Final = (
    "buffer_steps", "max_queue", "shutdown_timeout_ms", "replay_stall_timeout_ms",
    "data_parallel_rank", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
    "curve_server_secret_key", "curve_allowed_client_keys",
)
#: Keyword arguments a subscriber driver may list in ``options``.
SUBSCRIBER_OPTIONS: Final = ("replay_timeout_ms", "heartbeat_ivl_ms", "heartbeat_timeout_ms",
                              "curve_client_secret_key", "curve_server_key")

PUBLISHER_ERRORS: ErrorTable = {
    "closed": lambda message, error: PublisherClosedError(message),
}
SUBSCRIBER_ERRORS: ErrorTable = {}
#: One ``publish_many`` request carries at most this many batches, and this many bytes of
#: them (one oversized batch goes alone): a request crosses in well under the watchdog's
#: limit on a loaded machine, and the driver holds one chunk decoded at a time.
MANY_BATCHES: Final = 500
MANY_BYTES: Final = 8 * 1024 * 1024
#: A ``publish_then_shutdown`` request carries the whole burst, at most this many batches
#: and bytes of them; the suite makes a longer burst with the plain calls.
BURST_BATCHES: Final = 5000
BURST_BYTES: Final = 16 * 1024 * 1024
_BATCH_ENCODER = msgspec.msgpack.Encoder()
_BYTES: Final = (bytes, bytearray, memoryview)


class _Factory:
    """``factory(endpoint, replay_endpoint, *, topic, **options)`` in one driver process."""

    resources_counted: Final = True
    contract: str = ""
    constructor: str = ""
    known_options: tuple[str, ...] = ()

    def __init__(self, command: str, hello: Hello) -> None:
        self.driver_command = command
        self.hello = hello
        self.zmq_conformance_capabilities = dict(hello.capabilities)
        self.options = tuple(o for o in hello.options if o in self.known_options)
        self.__signature__ = signature(("endpoint", "replay_endpoint"),
                                       ("topic", *self.options), {"topic": ""})

    def _build(self, endpoint: str, replay_endpoint: str, topic: str,
               kwargs: Mapping[str, Any], errors: ErrorTable) -> tuple[Any, Any]:
        args: dict[str, Any] = {"endpoint": endpoint, "replay_endpoint": replay_endpoint,
                                "topic": topic}
        args.update({k: v for k, v in kwargs.items() if k in self.options})
        return build(self.driver_command, self.contract, self.constructor, args, errors,
                     what=f"{self.constructor} factory({endpoint!r}, {replay_endpoint!r})")

    def __repr__(self) -> str:
        return f"<{self.contract} driver {self.driver_command!r}>"


class PublisherFactory(_Factory):
    contract = PUBLISHER
    constructor = "publisher"
    known_options = PUBLISHER_OPTIONS

    def __call__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **kwargs: Any) -> DriverPublisher:
        process, result = self._build(endpoint, replay_endpoint, topic, kwargs,
                                      PUBLISHER_ERRORS)
        publisher = DriverPublisher(process, int(result["handle"]),
                                    f"publisher on {endpoint} ({process.label})")
        publisher.endpoint = str(result.get("endpoint") or endpoint)
        publisher.replay_endpoint = str(result.get("replay_endpoint") or replay_endpoint)
        return publisher


class SubscriberFactory(_Factory):
    contract = SUBSCRIBER
    constructor = "subscriber"
    known_options = SUBSCRIBER_OPTIONS

    def __call__(self, endpoint: str, replay_endpoint: str, *, topic: str = "",
                 **kwargs: Any) -> DriverSubscriber:
        process, result = self._build(endpoint, replay_endpoint, topic, kwargs,
                                      SUBSCRIBER_ERRORS)
        return DriverSubscriber(process, int(result["handle"]),
                                f"subscriber of {endpoint} ({process.label})")


def _stats(remote: Remote) -> dict[str, int]:
    try:
        got = remote._call("stats")
    except NotImplementedError:
        return {}
    return dict(got) if isinstance(got, Mapping) else {}


class DriverPublisher(Remote):
    """A publisher in a driver process: ``publish()``, ``shutdown()``, ``stats()``."""

    errors: ClassVar[ErrorTable] = PUBLISHER_ERRORS
    endpoint: str = ""
    replay_endpoint: str = ""

    def publish(self, batch: Any) -> None:
        # msgspec writes a Struct as its map form (events tagged by ``type``, bytes as
        # ``bin``) straight into the frame; to_builtins first would cost ten times more.
        try:
            self._call("publish", {"batch": batch})
        except (OverflowError, TypeError) as exc:
            # Nothing was sent: MessagePack cannot carry this batch (an int beyond 64
            # bits). Reported as a refused publish(), which EVT-1 allows.
            raise ValueError(f"publish(): the batch cannot cross the driver protocol "
                             f"({exc})") from None

    def shutdown(self) -> None:
        self._closing("shutdown")

    def stats(self) -> dict[str, int]:
        return _stats(self)

    #: The driver answered ``publish_many`` with ``unsupported``: publish one by one.
    _one_by_one = False

    def zmq_conformance_publish_many(self, batches: Sequence[Any]
                                     ) -> tuple[list[Exception | None], float] | None:
        """``publish()`` of each batch in turn, run back to back in the driver process
        (``publish_many``, docs/drivers.md, section 6): what each call raised (``None``:
        it returned) and the implementation's own time in them all, in seconds.

        ``None`` when the driver does not offer the call (protocol 1 without this
        addition): the caller then calls :meth:`publish` for each batch. A burst
        crosses in chunks (:data:`MANY_BATCHES`, :data:`MANY_BYTES`), so the calls of
        one chunk reach the implementation at the pace of a loop in its own process,
        as they do in-process, not at the pace of one round trip each.
        """
        if self._one_by_one:
            return None
        outcomes: list[Exception | None] = []
        seconds = 0.0
        for number, chunk in enumerate(_chunks(batches, outcomes)):
            try:
                got = self._call("publish_many", {"batches": [raw for _, raw in chunk]},
                                 limit=watchdog.default_limit() + 0.01 * len(chunk))
            except NotImplementedError:
                if number:  # pragma: no cover - a driver that changed its mind mid-burst
                    raise
                self._one_by_one = True
                return None
            except AssertionError:  # blocked, crashed: the verdict of the whole burst
                raise
            except Exception as exc:  # the call as a whole failed: each publish() raised it
                got = [exc] * len(chunk)
            seconds += self.last_call_seconds or 0.0
            if not isinstance(got, list) or len(got) != len(chunk):
                raise DriverCrashed(
                    f"publish_many() on {self._name}: the driver answered "
                    f"{type(got).__name__} {str(got)[:80]!r}, not an array of "
                    f"{len(chunk)} outcomes (nil or an error map) in the order of the batches")
            for (index, _), outcome in zip(chunk, got, strict=True):
                outcomes[index] = (outcome if outcome is None or isinstance(outcome, Exception)
                                   else self._outcome(outcome))
        return outcomes, seconds

    #: The driver answered ``publish_copies`` with ``unsupported``.
    _no_copies = False

    def zmq_conformance_publish_copies(self, batch: Any, count: int
                                       ) -> tuple[list[Exception | None], float] | None:
        """``publish()`` of ``count`` copies of ``batch``, copy ``k`` with ``ts + k``, run
        back to back in the driver process (``publish_copies``, docs/drivers.md,
        section 6): the outcomes and the implementation's time, as
        :meth:`zmq_conformance_publish_many`. The batch crosses once, so a burst of
        large batches (EVT-3's) reaches the implementation whole, as it does
        in-process. ``None`` when the driver does not offer the call."""
        if self._no_copies or count < 1:
            return None
        try:
            got = self._call("publish_copies", {"batch": batch, "count": count},
                             limit=watchdog.default_limit() + 0.01 * count)
        except NotImplementedError:
            self._no_copies = True
            return None
        except (OverflowError, TypeError) as exc:
            return [ValueError(f"publish(): the batch cannot cross the driver protocol "
                               f"({exc})")] * count, 0.0
        except AssertionError:  # blocked, crashed: the verdict of the whole burst
            raise
        except Exception as exc:  # the call as a whole failed: each publish() raised it
            return [exc] * count, self.last_call_seconds or 0.0
        if not isinstance(got, list) or len(got) != count:
            raise DriverCrashed(
                f"publish_copies() on {self._name}: the driver answered "
                f"{type(got).__name__} {str(got)[:80]!r}, not an array of {count} outcomes")
        outcomes = [None if outcome is None else self._outcome(outcome) for outcome in got]
        return outcomes, self.last_call_seconds or 0.0

    #: The driver declared ``publish_copies_timed`` but answered it with ``unsupported``.
    _no_timed_copies = False

    def zmq_conformance_publish_copies_timed(
        self, batch: Any, count: int, *, limit: float,
    ) -> tuple[list[Exception | None], list[float]] | None:
        """``publish()`` of ``count`` copies of ``batch``, copy ``k`` with ``ts + k``, back
        to back in the driver process, in one request (``publish_copies_timed``,
        docs/drivers.md, section 6): what each call raised (``None``: it returned) and
        each call's own time in seconds, as the driver measured it. ``limit`` is what
        one call may take; the request may take that plus the crossing.

        ``None``, with nothing sent, when the driver did not declare the call in its
        hello (``calls``): the caller then makes the burst with ``publish_copies`` in
        runs, as before this addition.
        """
        if (count < 1 or self._no_timed_copies
                or not self._process.hello.offers("publish_copies_timed")):
            return None
        try:
            got = self._call("publish_copies_timed", {"batch": batch, "count": count},
                             limit=limit + watchdog.default_limit() + 0.01 * count)
        except NotImplementedError:  # declared, then refused: the old path from now on
            self._no_timed_copies = True
            return None
        except (OverflowError, TypeError) as exc:
            refused = ValueError(f"publish(): the batch cannot cross the driver protocol "
                                 f"({exc})")
            return [refused] * count, [0.0] * count
        except AssertionError:  # blocked, crashed: the verdict of the whole burst
            raise
        except Exception as exc:  # the call as a whole failed: each publish() raised it
            return [exc] * count, [0.0] * count
        shape = (f"publish_copies_timed() on {self._name}: the driver answered "
                 f"{str(got)[:80]!r}, not a map of 'outcomes' (nil or an error map) and "
                 f"'elapsed_ns' (an int), {count} of each")
        if not isinstance(got, Mapping):
            raise DriverCrashed(shape)
        answers, elapsed = got.get("outcomes"), got.get("elapsed_ns")
        if (not isinstance(answers, list) or not isinstance(elapsed, list)
                or len(answers) != count or len(elapsed) != count
                or not all(a is None or isinstance(a, Mapping) for a in answers)
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                           for n in elapsed)):
            raise DriverCrashed(shape)
        outcomes = [None if a is None else self._outcome(a) for a in answers]
        return outcomes, [n / 1e9 for n in elapsed]

    #: The driver answered ``publish_then_shutdown`` with ``unsupported``.
    _no_burst_shutdown = False

    def zmq_conformance_publish_then_shutdown(
        self, batches: Sequence[Any], *, limit: float,
    ) -> tuple[list[Exception | None], Mapping[str, Any] | None, float, float] | None:
        """``publish()`` of each batch, then ``stats()``, then ``shutdown()``, back to back
        in the driver process (``publish_then_shutdown``, docs/drivers.md, section 6):
        the outcomes, the stats taken just before ``shutdown()`` (``None``: none), the
        implementation's time in the publishes and in ``shutdown()``, as the driver
        measured them. No round trip between the last ``publish()`` and ``shutdown()``,
        so what the publisher had not sent yet is still queued when ``shutdown()``
        starts, as it is in-process (EVT-7's backlog).

        ``None``, with nothing sent, when the driver does not offer the call or the
        burst does not fit in one request (:data:`BURST_BATCHES`, :data:`BURST_BYTES`):
        the caller then publishes and shuts down with the plain calls. ``limit`` is
        what ``shutdown()`` may take; the crossing of the batches is added to it.
        """
        if self._no_burst_shutdown:
            return None
        outcomes: list[Exception | None] = []
        encoded: list[tuple[int, msgspec.Raw]] = []
        size = 0
        for index, batch in enumerate(batches):
            try:
                raw = msgspec.Raw(_BATCH_ENCODER.encode(batch))
            except (OverflowError, TypeError) as exc:
                outcomes.append(ValueError(f"publish(): the batch cannot cross the driver "
                                           f"protocol ({exc})"))
                continue
            outcomes.append(None)
            encoded.append((index, raw))
            size += len(raw)
            if len(encoded) > BURST_BATCHES or size > BURST_BYTES:
                return None
        try:
            got = self._closing("publish_then_shutdown",
                                {"batches": [raw for _, raw in encoded]},
                                limit=limit + 0.01 * len(encoded))
        except NotImplementedError:
            self._no_burst_shutdown = True
            return None
        shape = (f"publish_then_shutdown() on {self._name}: the driver answered "
                 f"{str(got)[:80]!r}, not a map of 'outcomes' (one per batch), 'stats', "
                 f"'publish_ns' and 'shutdown_ns'")
        if not isinstance(got, Mapping):
            raise DriverCrashed(shape)
        answers, stats = got.get("outcomes"), got.get("stats")
        publish_ns, shutdown_ns = got.get("publish_ns"), got.get("shutdown_ns")
        if (not isinstance(answers, list) or len(answers) != len(encoded)
                or not (stats is None or isinstance(stats, Mapping))
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                           for n in (publish_ns, shutdown_ns))):
            raise DriverCrashed(shape)
        for (index, _), outcome in zip(encoded, answers, strict=True):
            outcomes[index] = None if outcome is None else self._outcome(outcome)
        assert isinstance(publish_ns, int) and isinstance(shutdown_ns, int)
        return outcomes, stats, publish_ns / 1e9, shutdown_ns / 1e9

    def _outcome(self, error: Any) -> Exception:
        if not isinstance(error, Mapping):
            raise DriverCrashed(f"publish_many() on {self._name}: an outcome is "
                                f"{error!r}, neither nil nor an error map")
        kind = str(error.get("kind", "error"))
        return to_exception(DriverReplyError(kind, str(error.get("message", "")), error),
                            self.errors)


def _chunks(batches: Sequence[Any], outcomes: list[Exception | None]
            ) -> Iterator[list[tuple[int, msgspec.Raw]]]:
    """The batches, each encoded once, in chunks for ``publish_many``; each is
    ``(index, encoded)``. A batch MessagePack cannot carry is refused here, as
    :meth:`DriverPublisher.publish` refuses it: its outcome is set, and it is not sent."""
    chunk: list[tuple[int, msgspec.Raw]] = []
    size = 0
    for index, batch in enumerate(batches):
        try:
            encoded = msgspec.Raw(_BATCH_ENCODER.encode(batch))
        except (OverflowError, TypeError) as exc:
            outcomes.append(ValueError(f"publish(): the batch cannot cross the driver "
                                       f"protocol ({exc})"))
            continue
        outcomes.append(None)
        if chunk and (len(chunk) == MANY_BATCHES or size + len(encoded) > MANY_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append((index, encoded))
        size += len(encoded)
    if chunk:
        yield chunk


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


def _typed(batch: Any) -> Any:
    """``batch`` as the suite's :class:`KVEventBatch` (what a Python subscriber returns),
    or as the driver sent it when it is not one: the suite then judges it as it is."""
    try:
        return normalize(batch)
    except (SchemaError, TypeError, ValueError):
        return batch


class DriverSubscriber(Remote):
    """A subscriber in a driver process: ``poll(timeout_ms)``, ``close()``, ``stats()``."""

    errors: ClassVar[ErrorTable] = SUBSCRIBER_ERRORS

    def poll(self, timeout_ms: int) -> Any:
        """The delivered ``(seq, batch)`` pairs; anything else is returned as the driver
        sent it, for the suite to judge as it judges a Python subscriber's result."""
        got = self._call("poll", {"timeout_ms": timeout_ms},
                         limit=timeout_ms / 1000 + watchdog.default_limit())
        if not isinstance(got, list):
            return got
        return [(pair[0], _typed(pair[1])) if isinstance(pair, list) and len(pair) == 2
                else pair for pair in got]

    def close(self) -> None:
        self._closing("close")

    def stats(self) -> dict[str, int]:
        return _stats(self)


# -- the Python driver's side (docs/drivers.md, section 6) ---------------------------


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
            typed = msgspec.convert(batch, KVEventBatch)
        except msgspec.ValidationError as exc:
            raise Refused("invalid", f"not a KVEventBatch: {exc}") from None
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
