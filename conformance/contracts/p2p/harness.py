"""Nodes, ports and synchronisation for tests against a p2p transport.

The suite, the stateful machines and the chaos tests all drive transports
through this module, so they share its guarantees:

- **Ports never collide.** :func:`~conformance.testing.net.free_port` asks
  the kernel for a free port on ``127.0.0.1``; a node whose bind then fails
  with ``EADDRINUSE`` (another process or xdist worker took the port in
  between) is rebuilt on a new port.
  :meth:`Cluster.restart` rebuilds a node on the *same* port, retrying
  briefly while libzmq still holds the old listener.
- **Nothing hangs.** Every call into the implementation goes through
  :mod:`conformance.supervision.watchdog`, so a call that blocks raises
  :class:`~conformance.errors.CallBlocked` naming the call.
- **No finalizer of the implementation runs mid-test.** Every transport the
  harness builds and every connection it is handed stays referenced until
  the process ends (:data:`_KEPT`). A transport that leaks its ZeroMQ
  context otherwise leaves it to the garbage collector, whose
  ``Context.__del__`` can block forever in ``term()`` at any allocation of
  any later test, outside every watchdog. Between tests,
  :func:`release_leftovers` closes what such a transport left open (under
  the watchdog) and lets the objects go.
- **No sleeps as synchronisation.** :func:`wait_until` drives ``poll()`` on
  the given nodes until a condition holds and fails with a message saying
  what did not happen when the deadline passes.
- **Only the interface.** Nodes and connections are reached through the
  duck-typed interface of ``DESIGN.md``; the raw objects stay available as
  ``.transport`` and ``.raw``.

Typical use::

    with Cluster(spec) as cluster:
        a, b = cluster.add_node("a"), cluster.add_node("b")
        conn = a.connect(b)
        conn.send({"n": 1})
        inbound = wait_inbound(b, a.local_id, nodes=[a, b])
        assert inbound.recv() == [{"n": 1}]
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import zmq
from hypothesis.control import currently_in_test_context

from conformance.contracts.p2p.spec import TransportSpec
from conformance.errors import CallBlocked
from conformance.supervision import cleanup, host_stall, watchdog
from conformance.supervision.runqueue import OwnDeadline
from conformance.testing.credentials import SuiteCredentials
from conformance.testing.net import HOST, free_port, is_address_in_use

__all__ = [
    "DEFAULT_WAIT_S",
    "PROPERTY_WAIT_S",
    "Cluster",
    "Connection",
    "Node",
    "expect_error",
    "handshake",
    "receive",
    "wait_inbound",
    "wait_until",
]

T = TypeVar("T")

#: Default deadline of :func:`wait_until`: ample for anything on loopback.
DEFAULT_WAIT_S = 5.0
#: Default deadline inside a Hypothesis example. Shrinking re-runs a failing
#: example dozens of times, each waiting out its deadline; 2 s (still
#: hundreds of times a loopback round trip) keeps a failing run in minutes.
PROPERTY_WAIT_S = 2.0
#: Fresh ports tried by :meth:`Cluster.add_node` before giving up.
_BIND_ATTEMPTS = 8
#: How long :meth:`Cluster.restart` retries a port libzmq has not released yet.
_REBIND_WINDOW_S = 3.0
#: Pause between polls in :func:`wait_until`: keeps a busy loop off the CPU
#: without adding visible latency.
_POLL_PAUSE_S = 0.001
#: Pause between rounds of polls where the suite lets time pass (a heartbeat
#: window, a pause, the moments traffic lands unpolled) or waits for an event on
#: the heartbeat's scale (a death, a reconnect): a twentieth of the suite's
#: heartbeat interval, far inside every bound's slack, and about a fifth of the
#: CPU of a 1 ms cadence (a process node answers each poll with a round trip).
WINDOW_PAUSE_S = 0.005

_names = itertools.count()
#: Every node the harness has built (with every transport and raw connection
#: it had), kept until the test is over (see the module docstring). The
#: objects of a closed reference transport are small; those of a leaking one
#: are exactly what must not be collected.
_KEPT: list[Any] = []
#: Contexts whose release blocked: kept for the life of the process.
_UNRELEASABLE: list[Any] = []
#: How deep :func:`release_leftovers` looks into a kept object for contexts.
_LEFTOVER_DEPTH = 5
#: Watchdog limit of releasing one leftover context (linger 0: nothing to wait for).
_RELEASE_LIMIT_S = 2.0
_CONTAINERS = (list, tuple, set, frozenset, dict, deque)


def release_leftovers(nodes: Iterable[Node] | None = None) -> list[str]:
    """Close the ZeroMQ contexts that closed transports left open.

    ``nodes=None`` (between tests: nothing of the test may be in use): every
    node the harness built since the last call; then the harness drops its
    references. Otherwise only ``nodes``, all closed and done with (a
    stateful machine's cluster after each example, so leaks of one example
    do not pile up into the next). Every context reachable from their
    transports and connections that is not closed yet is destroyed with
    linger 0 under the watchdog; one whose release blocks stays referenced
    for the rest of the process. Returns a description of each context
    released.
    """
    roots: list[Any] = list(_KEPT) if nodes is None else list(nodes)
    released: list[str] = []
    for ctx in _contexts_in(roots):
        if ctx.closed:
            continue
        try:
            with watchdog.guard(f"releasing a leftover context {ctx!r}", _RELEASE_LIMIT_S):
                ctx.destroy(linger=0)
            released.append(repr(ctx))
        except CallBlocked:
            _UNRELEASABLE.append(ctx)
    if nodes is None:
        _KEPT.clear()
    return released


# Between suite tests the plugin runs this (release every node built since).
cleanup.after_each_test(release_leftovers)


def _contexts_in(roots: Iterable[Any]) -> list[zmq.Context[Any]]:
    """The contexts reachable from ``roots`` through attributes and containers."""
    found: dict[int, zmq.Context[Any]] = {}
    seen: set[int] = set()
    frontier = list(roots)
    for _ in range(_LEFTOVER_DEPTH):
        following: list[Any] = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float)):
                continue
            seen.add(id(obj))
            if isinstance(obj, zmq.Context):
                found[id(obj)] = obj
                continue
            if isinstance(obj, zmq.Socket):
                following.append(obj.context)
                continue
            if isinstance(obj, dict):
                following.extend(obj.values())
            elif isinstance(obj, _CONTAINERS):
                following.extend(obj)
            else:
                following.extend(getattr(obj, "__dict__", {}).values())
        frontier = following
    return list(found.values())


def wait_until(
    condition: Callable[[], T],
    *,
    nodes: Iterable[Node] = (),
    timeout: float | None = None,
    what: str,
) -> T:
    """Drive ``poll()`` on ``nodes`` until ``condition()`` is truthy; return its value.

    The condition is checked first, then each open node is polled (through
    the watchdog), with a 1 ms pause per round. When ``timeout`` seconds pass
    without success, raises ``AssertionError("timed out after ...: <what>")``;
    the seconds are the process's own (:class:`~conformance.supervision.runqueue.OwnDeadline`:
    time the host kept its threads in the run queue is added back).
    ``timeout`` defaults to :data:`DEFAULT_WAIT_S`, or :data:`PROPERTY_WAIT_S`
    inside a Hypothesis example.
    Never sleeps for a fixed time and never hangs.
    """
    node_list = list(nodes)
    timeout = _resolve(timeout)
    deadline = OwnDeadline(timeout)
    while True:
        result = condition()
        if result:
            return result
        if deadline.expired():
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for: {what}")
        for node in node_list:
            if not node.closed:
                node.poll()
        time.sleep(_POLL_PAUSE_S)


def _resolve(timeout: float | None) -> float:
    """An explicit timeout, else the default for the current context."""
    if timeout is not None:
        return timeout
    return PROPERTY_WAIT_S if currently_in_test_context() else DEFAULT_WAIT_S


def wait_inbound(
    node: Node,
    peer_id: str,
    *,
    nodes: Iterable[Node] = (),
    exclude: Iterable[Connection] = (),
    timeout: float | None = None,
    what: str | None = None,
) -> Connection:
    """Poll ``node`` (and ``nodes``) until it reports an inbound connection from ``peer_id``.

    Connections in ``exclude`` (e.g. the peer's previous one) do not count.
    Returns the first matching connection ``node.poll()`` has returned.
    """
    skip = {id(c.raw) for c in exclude}
    pollers = [node, *(n for n in nodes if n is not node)]

    def found() -> Connection | None:
        for conn in node.inbound:
            if id(conn.raw) not in skip and conn.peer_id == peer_id:
                return conn
        return None

    conn = wait_until(
        found,
        nodes=pollers,
        timeout=timeout,
        what=what or f"{node.name} to report an inbound connection from {peer_id} via poll()",
    )
    assert conn is not None  # wait_until returns only truthy values
    return conn


def receive(
    conn: Connection,
    count: int,
    *,
    nodes: Iterable[Node] = (),
    timeout: float | None = None,
    what: str | None = None,
) -> list[dict[str, Any]]:
    """Call ``conn.recv()`` while polling ``nodes`` until ``count`` messages arrived.

    Returns everything received (possibly more than ``count``, which the
    caller can assert on). The connection's own node is always polled.
    """
    got: list[dict[str, Any]] = []
    pollers = [conn.node, *(n for n in nodes if n is not conn.node)]

    def enough() -> bool:
        got.extend(conn.recv())
        return len(got) >= count

    wait_until(
        enough,
        nodes=pollers,
        timeout=timeout,
        what=what or f"{count} message(s) on {conn} (got {len(got)} so far)",
    )
    return got


def expect_error(action: Callable[[], object], *, what: str) -> Exception:
    """Run ``action`` and return the exception it raised; fail if it raised none.

    :class:`CallBlocked` is never taken for the expected error: a call that
    hangs is reported as blocked, not as "raised".
    """
    try:
        action()
    except CallBlocked:
        raise
    except Exception as exc:
        return exc
    raise AssertionError(f"{what} did not raise")


def handshake(
    a: Node, b: Node, *, hello: dict[str, Any] | None = None, timeout: float | None = None
) -> tuple[Connection, Connection]:
    """``a`` connects to ``b`` and sends ``hello``; returns (a's connection, b's inbound one).

    Waits until ``b``'s ``poll()`` reports the inbound connection and its
    ``recv()`` has returned the hello, so both ends are established.
    """
    message = hello if hello is not None else {"hello": a.local_id}
    out = a.connect(b)
    out.send(message)
    inbound = wait_inbound(b, a.local_id, nodes=[a], timeout=timeout,
                           exclude=[c for c in b.inbound if c.peer_id == a.local_id])
    got = receive(inbound, 1, nodes=[a], timeout=timeout,
                  what=f"the hello from {a.local_id} at {b.name}")
    if got != [message]:
        raise AssertionError(f"{b.name} received {got!r} instead of the hello {message!r}")
    return out, inbound


class Connection:
    """A connection object of the implementation, with every call guarded.

    Behaves like the raw connection (``peer_id``, ``alive``, ``send``,
    ``recv``, ``mark_dead``, ``close``) and checks what the interface
    promises about return types. ``raw`` is the implementation's object;
    ``received`` keeps everything ``recv()`` has returned through this proxy.
    """

    def __init__(self, raw: Any, node: Node, *, inbound: bool) -> None:
        self.raw = raw
        self.node = node
        self.inbound = inbound
        self.received: list[dict[str, Any]] = []
        # The previous recv() result and a copy, to notice a reused buffer.
        self._last_raw: Any = None
        self._last_copy: list[Any] = []

    @property
    def peer_id(self) -> str:
        with watchdog.guard(f"{self._where()}.peer_id"):
            value = self.raw.peer_id
        if not isinstance(value, str):
            raise AssertionError(f"{self._where()}: peer_id is {value!r}, not a str")
        return value

    @property
    def alive(self) -> bool:
        with watchdog.guard(f"{self._where()}.alive"):
            value = self.raw.alive
        if not isinstance(value, bool):
            raise AssertionError(f"{self._where()}: alive is {value!r}, not a bool")
        return value

    def send(self, msg: dict[str, Any], *, limit: float | None = None) -> None:
        """``raw.send(msg)``; ``limit`` overrides the watchdog limit for this call."""
        with watchdog.guard(f"{self._where()}.send()", limit):
            self.raw.send(msg)

    def send_many(self, msgs: Sequence[dict[str, Any]], *, limit: float | None = None,
                  keep_going: bool = False) -> list[Exception]:
        """``send()`` of each message in turn, each under the watchdog (``limit`` per
        send), as a caller's loop makes them; what the sends raised.

        The first exception is raised, and later messages are not sent, unless
        ``keep_going``: then every message is sent and the exceptions are returned
        (a blocked send still ends the test). Through a driver that offers
        ``send_many`` (``docs/drivers.md``, section 5) the loop runs in the driver
        process: a round trip per message is most of a driver's cost under load.
        Each send is still judged on its own time there, as the driver measured it,
        against ``limit`` plus any host stall measured meanwhile.
        """
        errors: list[Exception] = []
        pending = list(msgs)
        many = getattr(self.raw, "zmq_conformance_send_many", None)
        while pending and callable(many):
            allowed = watchdog.default_limit() if limit is None else limit
            since = time.monotonic()
            with watchdog.guard(f"{self._where()}.send() of {len(pending)} messages, back "
                                f"to back", allowed + watchdog.default_limit()
                                + 0.01 * len(pending)):
                got = many(pending, limit=allowed, keep_going=keep_going)
            if got is None:
                break
            for number, (error, seconds) in enumerate(got):
                if seconds > allowed + host_stall.stall_ms(since) / 1000:
                    raise CallBlocked(f"{self._where()}.send() (message {number + 1} of "
                                      f"{len(pending)} sent back to back)", seconds)
                if error is not None:
                    if not keep_going:
                        raise error
                    errors.append(error)
            del pending[:len(got)]
        for msg in pending:
            try:
                self.send(msg, limit=limit)
            except CallBlocked:
                raise
            except Exception as exc:
                if not keep_going:
                    raise
                errors.append(exc)
        return errors

    def recv(self) -> list[dict[str, Any]]:
        """``raw.recv()`` as a list, checked to hold only dicts."""
        with watchdog.guard(f"{self._where()}.recv()"):
            result = self.raw.recv()
        if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
            raise AssertionError(
                f"{self._where()}.recv() returned {type(result).__name__}, "
                "not a sequence of messages"
            )
        messages = list(result)
        if self._last_raw is not None and list(self._last_raw) != self._last_copy:
            raise AssertionError(
                f"{self._where()}.recv() changed the sequence it returned before "
                "(a shared buffer): the caller's earlier messages vanished (MSG-3)"
            )
        self._last_raw, self._last_copy = result, messages
        for msg in messages:
            if not isinstance(msg, dict):
                raise AssertionError(
                    f"{self._where()}.recv() handed over a {type(msg).__name__} ({msg!r:.80}); "
                    "messages are dicts and a peer's non-dict payload must be dropped (POLL-3)"
                )
        self.received.extend(messages)
        return messages

    def mark_dead(self) -> None:
        with watchdog.guard(f"{self._where()}.mark_dead()"):
            self.raw.mark_dead()

    def close(self) -> None:
        with watchdog.guard(f"{self._where()}.close()"):
            self.raw.close()

    def _where(self) -> str:
        side = "inbound" if self.inbound else "outbound"
        return f"{self.node.name}:{side} connection"

    def __repr__(self) -> str:
        side = "inbound" if self.inbound else "outbound"
        return f"<Connection {side} on {self.node.name} ({self.node.local_id}) raw={self.raw!r}>"


class Node:
    """One transport instance: its address, its raw transport, what ``poll()`` returned.

    ``inbound`` lists every connection ``poll()`` has returned since the node
    was (re)built, in order. :meth:`poll` fails with a POLL-1 message when a
    connection is returned a second time. Build nodes with
    :meth:`Cluster.add_node`.
    """

    def __init__(self, name: str, *, host: str, port: int, local_id: str, transport: Any) -> None:
        self.name = name
        self._poll_call = f"{name}.poll()"
        self.host = host
        self.port = port
        self.local_id = local_id
        self.transport = transport
        self.closed = False
        self.generation = 0
        self.inbound: list[Connection] = []
        self.polls = 0
        self._wrappers: dict[int, Connection] = {}
        #: Every transport and raw connection this node has had (see _KEPT).
        self._kept: list[Any] = [transport]
        _KEPT.append(self)

    def connect(self, peer: Node | str) -> Connection:
        """``transport.connect(peer_id)`` (guarded); returns the connection proxy."""
        peer_id = peer.local_id if isinstance(peer, Node) else peer
        with watchdog.guard(f"{self.name}.connect({peer_id!r})"):
            raw = self.transport.connect(peer_id)
        return self._wrap(raw, inbound=False)

    def poll(self) -> list[Connection]:
        """``transport.poll()`` (guarded); records and returns the new inbound connections."""
        with watchdog.guard(self._poll_call):
            result = self.transport.poll()
        self.polls += 1
        if result.__class__ is list and not result:  # the common answer, checked cheaply
            return []
        if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
            raise AssertionError(
                f"{self.name}.poll() returned {type(result).__name__}, "
                "not a sequence of connections"
            )
        new = [self._wrap(raw, inbound=True) for raw in result]
        for conn in new:
            if any(conn is seen for seen in self.inbound) or new.count(conn) > 1:
                raise AssertionError(
                    f"POLL-1: {self.name}.poll() returned the inbound connection from "
                    f"{conn.peer_id} again; each is returned by exactly one poll()"
                )
        self.inbound.extend(new)
        return new

    def close(self) -> None:
        """``transport.close()`` (guarded). Marks the node closed even if it raises.

        The transport stays referenced afterwards (:data:`_KEPT`), so a
        context it failed to terminate is never garbage-collected mid-run.
        """
        self.closed = True
        with watchdog.guard(f"{self.name}.close()"):
            self.transport.close()

    def wrap(self, raw: Any) -> Connection:
        """The proxy for a raw connection object of this node."""
        found = self._wrappers.get(id(raw))
        if found is None:
            raise KeyError(f"{raw!r} was never returned by {self.name}")
        return found

    def _wrap(self, raw: Any, *, inbound: bool) -> Connection:
        found = self._wrappers.get(id(raw))
        if found is not None and found.raw is raw:
            return found
        proxy = Connection(raw, self, inbound=inbound)
        self._kept.append(raw)
        # The proxy keeps ``raw`` alive, so its id is not reused while cached.
        self._wrappers[id(raw)] = proxy
        return proxy

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Node {self.name} {self.local_id} port={self.port} {state}>"


class Cluster:
    """A set of nodes built from one :class:`TransportSpec`; closes them all on exit.

    ``host`` is where nodes bind (``127.0.0.1``). ``call_limit`` overrides the
    watchdog limit for building and closing nodes.
    """

    def __init__(
        self, spec: TransportSpec, *, host: str = HOST, call_limit: float | None = None,
        credentials: SuiteCredentials | None = None,
    ) -> None:
        self.spec = spec
        self.host = host
        self.call_limit = call_limit
        #: CURVE keys every node gets (``None``: authentication off).
        self.credentials = credentials
        self.nodes: list[Node] = []
        self._build_options: dict[int, dict[str, int]] = {}
        self._node_credentials: dict[int, SuiteCredentials | None] = {}

    # -- building ---------------------------------------------------------

    def add_node(
        self,
        name: str | None = None,
        *,
        port: int | None = None,
        local_id: str | None = None,
        **options: int,
    ) -> Node:
        """Build a node bound on ``host:port`` and known as ``local_id``.

        Without ``port`` a free one is chosen, and a new one tried (up to
        8 times) when binding fails with ``EADDRINUSE``. ``local_id``
        defaults to :meth:`_advertise` (``"host:port"`` here); pass the
        proxy's address when a proxy sits in front of the node. ``options``
        are heartbeat overrides handed to :meth:`TransportSpec.build`. The node
        gets the cluster's :attr:`credentials` (see :meth:`add_node_as`).
        """
        keys = self.credentials
        label = name or f"node{next(_names)}"
        attempts = 1 if port is not None else _BIND_ATTEMPTS
        last: BaseException | None = None
        for _ in range(attempts):
            chosen = port if port is not None else free_port(self.host)
            ident = local_id or self._advertise(label, chosen)
            try:
                transport = self._build(label, ident, chosen, options, keys)
            except BaseException as exc:
                if local_id is None:
                    self._withdraw(ident)
                if isinstance(exc, CallBlocked) or not (
                    isinstance(exc, Exception) and is_address_in_use(exc)
                ):
                    raise
                last = exc
                continue
            node = Node(label, host=self.host, port=chosen, local_id=ident, transport=transport)
            self.nodes.append(node)
            self._build_options[id(node)] = dict(options)
            self._node_credentials[id(node)] = keys
            return node
        raise AssertionError(
            f"could not bind node {label!r} after {attempts} attempt(s): {last!r}"
        ) from last

    def _advertise(self, label: str, port: int) -> str:
        """The ``local_id`` of a node about to bind ``port``: its own address.

        A subclass that puts something in front of its nodes (the chaos
        cluster's proxies) returns that address instead.
        """
        return f"{self.host}:{port}"

    def _withdraw(self, local_id: str) -> None:
        """Undo :meth:`_advertise` for a node that failed to bind (nothing to undo here)."""

    def add_node_as(self, credentials: SuiteCredentials, name: str) -> Node:
        """:meth:`add_node` with other keys than the cluster's (a stranger, SEC-2)."""
        saved, self.credentials = self.credentials, credentials
        try:
            return self.add_node(name)
        finally:
            self.credentials = saved

    def restart_as(self, node: Node, credentials: SuiteCredentials) -> Node:
        """:meth:`restart` with new keys: the node comes back with another identity."""
        self._node_credentials[id(node)] = credentials
        return self.restart(node)

    def restart(self, node: Node) -> Node:
        """Close ``node``'s transport and build a new one on the same port and ``local_id``.

        The new transport gets the keys the node had (see :meth:`restart_as`).

        Binding is retried for up to 3 s while the old listener is still being
        released. The same :class:`Node` is returned with a new transport, an
        empty ``inbound`` list and ``generation`` incremented.
        """
        if not node.closed:
            node.close()
        options = self._build_options.get(id(node), {})
        keys = self._node_credentials.get(id(node), self.credentials)
        deadline = time.monotonic() + _REBIND_WINDOW_S
        while True:
            try:
                transport = self._build(node.name, node.local_id, node.port, options, keys)
                break
            except CallBlocked:
                raise
            except Exception as exc:
                if not is_address_in_use(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)
        node.transport = transport
        node._kept.append(transport)
        node.closed = False
        node.generation += 1
        node.inbound = []
        node._wrappers = {}
        return node

    def _build(self, label: str, local_id: str, port: int, options: dict[str, int],
               credentials: SuiteCredentials | None = None) -> Any:
        with watchdog.guard(f"factory({local_id!r}, {self.host!r}, {port}) for {label}",
                            self.call_limit):
            if credentials is None:
                return self.spec.build(local_id, self.host, port, **options)
            return self.spec.build(local_id, self.host, port, credentials, **options)

    # -- driving ----------------------------------------------------------

    def open_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.closed]

    def poll_all(self) -> dict[str, list[Connection]]:
        """Poll every open node once; new inbound connections by node name."""
        return {node.name: node.poll() for node in self.open_nodes()}

    def drive(self, seconds: float, *, nodes: Iterable[Node] | None = None) -> None:
        """Poll ``nodes`` (default: all open ones) repeatedly for ``seconds``.

        Not a synchroniser: use it to open a window in which traffic lands
        at *other* nodes without them being polled, or to observe that
        something does *not* happen within a bounded time. Its rounds are
        :data:`WINDOW_PAUSE_S` apart: every poll still takes all that landed,
        and a node in a driver or process of its own answers each poll with
        a round trip (these windows were most of a p2p run's 12,000 of them).
        """
        targets = list(nodes) if nodes is not None else self.open_nodes()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for node in targets:
                if not node.closed:
                    node.poll()
            time.sleep(WINDOW_PAUSE_S)

    def settle(
        self, *, quiet: float = 0.05, timeout: float = 2.0, nodes: Iterable[Node] | None = None
    ) -> list[Connection]:
        """Poll until no node reports a new inbound connection for ``quiet`` seconds.

        Returns the inbound connections reported meanwhile. Stops after
        ``timeout`` even if connections keep arriving. A quiet window lets
        time pass, so its rounds are :data:`WINDOW_PAUSE_S` apart, as
        :meth:`drive`'s are.
        """
        targets = list(nodes) if nodes is not None else self.open_nodes()
        seen: list[Connection] = []
        deadline = time.monotonic() + timeout
        last_news = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last_news < quiet:
            for node in targets:
                if not node.closed:
                    new = node.poll()
                    if new:
                        seen.extend(new)
                        last_news = time.monotonic()
            time.sleep(WINDOW_PAUSE_S)
        return seen

    def wait_until(
        self,
        condition: Callable[[], T],
        *,
        what: str,
        timeout: float | None = None,
        nodes: Iterable[Node] | None = None,
    ) -> T:
        """:func:`wait_until` polling ``nodes`` (default: every open node)."""
        targets = list(nodes) if nodes is not None else self.open_nodes()
        return wait_until(condition, nodes=targets, timeout=timeout, what=what)

    # -- teardown ---------------------------------------------------------

    def close(self) -> None:
        """Close every open node, each under the watchdog.

        Every node is attempted even if an earlier one blocks or raises; the
        first error (a :class:`CallBlocked` first) is raised afterwards.
        """
        errors: list[BaseException] = []
        for node in self.nodes:
            if node.closed:
                continue
            try:
                node.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            blocked = [e for e in errors if isinstance(e, CallBlocked)]
            raise (blocked or errors)[0]

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.close()
        except Exception as close_error:
            if exc is None:
                raise
            # Keep the test's own failure as the primary one.
            exc.add_note(f"also, while closing the cluster: {close_error!r}")
