"""Both KV-event contracts through a driver: publisher and subscriber proxies.

The suites hand a publisher :class:`~reference_impl.kv_events.schema.KVEventBatch`
objects and compare a subscriber's batches field by field after
:func:`~reference_impl.kv_events.schema.normalize`. A batch crosses the
protocol in its map form (``msgspec.to_builtins``: events tagged by
``type``), and a subscriber's batches come back as the driver sent them
(map or array form), which ``normalize`` reads. Calls follow
``docs/drivers.md``, section 6; the Python driver's side is
:mod:`conformance.contracts.kv_events.service`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Final

import msgspec

from conformance.contracts.kv_events.service import PUBLISHER_OPTIONS, SUBSCRIBER_OPTIONS
from conformance.drivers.process import DriverCrashed, DriverReplyError
from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature, to_exception
from conformance.supervision import watchdog
from reference_impl.kv_events.publisher import PublisherClosedError
from reference_impl.kv_events.schema import SchemaError, normalize

__all__ = ["DriverPublisher", "DriverSubscriber", "PublisherFactory", "SubscriberFactory"]

PUBLISHER: Final = "kv-events-publisher"
SUBSCRIBER: Final = "kv-events-subscriber"
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
