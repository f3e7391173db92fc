"""What the Python driver shares with each family's service: handles, refusals, error kinds.

The Python driver (:mod:`conformance.drivers.python`) knows no contract by
heart. For the contract its hello names, it asks the registry for that
family's :class:`Service` (the ``python_service`` entry of
:class:`~conformance.contracts.Contract`, a class in the family's
``driver.py``), and forwards every request to it. A service turns a
request into one call of the Python implementation and its result into
protocol values; this module holds what every service needs:

- :class:`Refused`: a request the driver itself answers with an error kind;
- :class:`Handles`: the objects built so far, by handle (never reused);
- :class:`Service`: the dispatch (``_<kind>_<call>`` methods), the hello's
  common fields, and the mapping of exceptions to error kinds
  (:meth:`Service.error`), with each family's own exception classes in
  :attr:`Service.error_kinds`;
- :func:`accepts`, :func:`declared`, :func:`target_name`: reading a Python
  implementation's signature, its declared capabilities and its name.
"""

from __future__ import annotations

import dataclasses
import errno
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final

__all__ = [
    "Handles", "Refused", "Service", "TwoSidedService", "accepts", "declared",
    "let_waiting_threads_run", "stats_of", "target_name",
]

_CAPABILITIES: Final = "zmq_conformance_capabilities"

#: ``(exception classes, kind)`` pairs, tried in order.
ErrorKinds = tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...]


class Refused(Exception):
    """A request this driver answers with an error of ``kind`` (not the implementation's)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Handles:
    """Handles of the objects built so far; a handle is never reused."""

    def __init__(self) -> None:
        self._by_handle: dict[int, Any] = {}
        self._handles: dict[int, int] = {}
        self._kinds: dict[int, str] = {}
        self._next = 1

    def issue(self, kind: str, obj: Any) -> int:
        """The handle of ``obj`` (a ``kind``), issuing one the first time it is seen."""
        found = self._handles.get(id(obj))
        if found is not None and self._by_handle.get(found) is obj:
            return found
        handle = self._next
        self._next += 1
        self._by_handle[handle] = obj
        self._handles[id(obj)] = handle
        self._kinds[handle] = kind
        return handle

    def get(self, handle: int) -> tuple[str, Any]:
        """``(kind, object)`` of ``handle``; an ``invalid`` refusal for one never issued."""
        try:
            return self._kinds[handle], self._by_handle[handle]
        except KeyError:
            raise Refused("invalid", f"no object has handle {handle}") from None


class Service:
    """One contract's calls on one Python implementation (``docs/drivers.md``, sections 5-8).

    A subclass names its constructors (:attr:`constructors`, each served by
    ``_construct_<name>(args)``) and serves each call ``C`` on an object of
    kind ``K`` with a method ``_K_C(obj, **args)``. :attr:`overhead_ns` is the
    driver's own share of the current call (converting arguments and
    results), which a reply's ``elapsed_ns`` leaves out. A call may set
    :attr:`after_reply`: the driver runs it once the reply is written, and it
    never returns (the engine pipeline's ``serve`` hands the process over to
    the engine).
    """

    #: Constructor names of the contract (calls on handle 0).
    constructors: ClassVar[tuple[str, ...]] = ()
    #: The family's exception classes and the error kinds they become.
    error_kinds: ClassVar[ErrorKinds] = ()
    #: The *declared* optional calls this service serves, named in the hello's ``calls``
    #: (``docs/drivers.md``, section 3): the suite sends them only to a driver listing them.
    declared_calls: ClassVar[tuple[str, ...]] = ()

    def __init__(self, contract: str, target: Any) -> None:
        self.contract = contract
        self.target = target
        self.objects = Handles()
        self.overhead_ns = 0
        self.after_reply: Callable[[], None] | None = None

    # -- the hello ----------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        """The driver's hello; a subclass adds ``capabilities``, ``options``, ``sides``."""
        answer: dict[str, Any] = {
            "type": "hello", "contract": self.contract,
            "implementation": f"Python driver: {target_name(self.target)}"}
        if self.declared_calls:
            answer["calls"] = list(self.declared_calls)
        return answer

    # -- calls ----------------------------------------------------------------------

    def call(self, handle: int, name: str, args: dict[str, Any]) -> Any:
        """Run one request and return its result (exceptions become error replies)."""
        self.overhead_ns = 0
        if handle == 0:
            if name not in self.constructors:
                raise Refused("unsupported", f"no constructor {name!r} in contract "
                                             f"{self.contract!r}")
            construct: Callable[[dict[str, Any]], Any] = getattr(self, f"_construct_{name}")
            return construct(args)
        kind, obj = self.objects.get(handle)
        method = getattr(self, f"_{kind}_{name}", None)
        if method is None:
            raise Refused("unsupported", f"a {kind} has no call {name!r}")
        return method(obj, **args)

    def new(self, kind: str, obj: Any) -> int:
        """Issue (or find) the handle of ``obj``, an object of ``kind``."""
        return self.objects.issue(kind, obj)

    # -- errors -----------------------------------------------------------------------

    def error(self, exc: BaseException) -> dict[str, Any]:
        """The error map for ``exc``: its kind by the family's classes, then the common ones."""
        body: dict[str, Any] = {"message": f"{type(exc).__name__}: {exc}"}
        if isinstance(exc, Refused):
            body.update(kind=exc.kind, message=str(exc))
            return body
        for classes, kind in self.error_kinds:
            if isinstance(exc, classes):
                body["kind"] = kind
                break
        else:
            if isinstance(exc, TimeoutError):
                body["kind"] = "timeout"
            elif _address_in_use(exc):
                body["kind"] = "address_in_use"
            elif isinstance(exc, NotImplementedError):
                body["kind"] = "unsupported"
            elif isinstance(exc, (ValueError, TypeError)):
                body["kind"] = "invalid"
            else:
                body["kind"] = "error"
        if body["kind"] == "rejected":
            reply = getattr(exc, "reply", None)
            body["reply"] = reply if isinstance(reply, dict) else {}
        return body


class TwoSidedService(Service):
    """A contract whose implementation object has two side factories (control's
    ``server``/``client``, the engine pipeline's ``engine``/``client``): the
    :attr:`constructors`. The target is that object, or a zero-argument callable
    returning one; one with neither side is refused at once. The hello names the
    sides it has."""

    #: The contract's name in a refusal ("no control implementation").
    family: ClassVar[str] = ""

    def __init__(self, contract: str, target: Any) -> None:
        sides = self.constructors
        if not any(hasattr(target, side) for side in sides) and callable(target):
            try:
                target = target()
            except Exception as exc:
                raise Refused("unsupported", f"{target_name(target)} is no {self.family} "
                                             f"implementation: calling it for one raised "
                                             f"{type(exc).__name__}: {exc}") from None
        if all(getattr(target, side, None) is None for side in sides):
            named = " nor ".join(f"{'an' if side[0] in 'aeiou' else 'a'} {side!r}"
                                 for side in sides)
            raise Refused("unsupported", f"{target_name(target)} has neither {named} factory")
        super().__init__(contract, target)

    def hello(self) -> dict[str, Any]:
        answer = super().hello()
        answer["sides"] = [s for s in self.constructors
                           if getattr(self.target, s, None) is not None]
        return answer

    def _side(self, name: str) -> Any:
        """The implementation's ``name`` factory; an ``unsupported`` refusal without one."""
        side = getattr(self.target, name, None)
        if side is None:
            raise Refused("unsupported", f"the implementation has no {name}")
        return side


def _address_in_use(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "errno", None) == errno.EADDRINUSE:
            return True
        if "address already in use" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def let_waiting_threads_run() -> None:
    """Release the interpreter lock once, before the calls a reply's ``elapsed_ns`` times.

    The driver's own work for a request (decoding it, converting its values) holds
    the lock. A thread of the implementation that wanted it meanwhile (a publisher's
    sending thread) has asked for it after ``sys.getswitchinterval()`` of waiting,
    and CPython then hands it over at the next chance: inside the first timed call,
    which would pay for the driver's work as if the implementation had waited for
    itself. Releasing it here (a zero sleep) hands it over first, outside the timing.
    In-process nothing decodes between a caller's calls, so this is what makes the
    two measure alike.

    It sleeps only while the process runs another Python thread, as ``threading``
    counts them (every thread that runs Python code, except a C thread that takes
    the lock without ever asking ``threading`` who it is). With the main thread
    alone nobody can be waiting, and the zero sleep is not free: Linux's timer
    slack makes it 50-80 us of wall time and about 18 us of CPU, two thirds of a
    p2p round trip through the driver, whose reference runs no Python thread.
    """
    if threading.active_count() > 1:
        time.sleep(0)


def accepts(factory: Any, name: str) -> bool:
    """True when ``factory`` takes the keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                 for p in params.values())


def declared(factory: Any) -> dict[str, Any]:
    """The capabilities ``factory`` declares (``zmq_conformance_capabilities``), as a map."""
    found = getattr(factory, _CAPABILITIES, None)
    if found is None:
        return {}
    if dataclasses.is_dataclass(found) and not isinstance(found, type):
        return dataclasses.asdict(found)
    return dict(found)


def target_name(target: Any) -> str:
    """``MODULE:QUALNAME`` of a factory or an implementation object, for the reports."""
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


def stats_of(obj: Any) -> Any:
    """``obj.stats()`` as a map of str to int; an ``unsupported`` refusal without one."""
    stats = getattr(obj, "stats", None)
    if not callable(stats):
        raise Refused("unsupported", "the implementation has no stats()")
    got = stats()
    return {str(k): v for k, v in dict(got).items()} if isinstance(got, Mapping) else {}
