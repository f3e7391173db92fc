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
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import msgspec

from conformance.drivers.protocol import Hello
from conformance.drivers.remote import ErrorTable, Remote, build, signature
from conformance.drivers.serving import Refused, Service, accepts, declared, stats_of
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
