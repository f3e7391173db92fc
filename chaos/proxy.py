"""The chaos suite's handle on a toxiproxy server: a small typed API.

``Toxiproxy.start()`` finds or starts a server (see ``chaos.launcher``:
``TOXIPROXY_URL``, else ``toxiproxy-server`` on PATH, else the embedded
server) and returns a handle. Every HTTP call goes through the
toxiproxy-python client's ``APIConsumer``, whose host and port are global
class attributes: the handle sets them to its own server under a lock
before each call, so several handles in one process do not step on each
other. Calls carry a timeout (the client has none of its own). Under the
same lock the client's ``requests`` is the handle's own ``requests.Session``:
one kept-alive HTTP connection per handle instead of a new session, TCP
connection and server-side accept for every call (about half the CPU of a
call on both sides; the chaos machines make hundreds per run), and it does not
read the environment (``trust_env`` off: proxy variables, ``.netrc``), which
cost another 1 ms of CPU per call. Requests and answers are byte for byte the
same.

Proxy names get a per-process prefix (``zmqc_<xdist worker>_<pid>_``) so
that pytest-xdist workers sharing one real server never collide, and
``reset()``/``destroy_all()`` only touch this handle's proxies (a shared
server's ``POST /reset`` would hit other workers' proxies).

Example::

    with Toxiproxy.start() as tp:
        p = tp.create_proxy("node_a", upstream="127.0.0.1:5555")
        p.add_toxic("latency", latency=200, jitter=20)
        ... connect to p.listen_host, p.listen_port ...
        with p.partitioned():  # silent partition: both streams blackholed
            ...
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import requests
import toxiproxy.api as _client
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.launcher import Prefer, ServerLease, launch
from conformance.errors import RunError

StreamName = Literal["upstream", "downstream"]
ToxicType = Literal[
    "latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer", "limit_data"
]

_HTTP_TIMEOUT_S = 30.0
#: What a call that hangs while the server still runs usually is (see docs/chaos.md).
_HUNG_HINT = (
    "; a control call that hangs while the server runs is toxiproxy-server's RemoveToxic "
    "deadlock (a toxic whose reader is stalled, e.g. a paused node; Shopify/toxiproxy#558), "
    "which wedges that proxy's API for good"
)
_STATUS_OF: dict[type[Exception], int] = {NotFound: 404, ProxyExists: 409, InvalidToxic: 400}
_API_LOCK = threading.RLock()


class ToxiproxyError(RuntimeError):
    """A toxiproxy API call failed; the message names the call and the server's answer."""


class FaultProxyStopped(RunError):
    """The fault proxy itself stopped (or stopped answering): a run error, never a verdict.

    Raised by every API call that cannot reach the server. The message names
    the proxy's address and kind, its exit status (or its process state while
    it still exists) and the last lines of its log
    (:meth:`chaos.launcher.ServerLease.describe_stop`). As a
    :class:`conformance.errors.RunError` it passes through every ``except
    Exception`` of the harnesses, so no machine can report it as RES-1 or
    any other clause.
    """


@dataclass(frozen=True)
class ToxicInfo:
    """A toxic as the server reports it."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: Mapping[str, int]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToxicInfo:
        return cls(
            name=str(data["name"]),
            type=str(data["type"]),
            stream=str(data.get("stream", "downstream")),
            toxicity=float(data.get("toxicity", 1.0)),
            attributes=dict(data.get("attributes") or {}),
        )


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as the server reports it."""

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[ToxicInfo, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProxyInfo:
        return cls(
            name=str(data["name"]),
            listen=str(data["listen"]),
            upstream=str(data["upstream"]),
            enabled=bool(data["enabled"]),
            toxics=tuple(ToxicInfo.from_json(t) for t in data.get("toxics") or ()),
        )


def _worker_prefix() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"zmqc_{worker}_{os.getpid()}_"


class Toxiproxy:
    """Handle on one toxiproxy server (see the module docstring)."""

    def __init__(self, host: str, port: int, *, lease: ServerLease | None = None) -> None:
        self.host = host
        #: Seconds an API call may take before the server counts as stopped answering.
        self.http_timeout_s = _HTTP_TIMEOUT_S
        self.port = port
        self.lease = lease
        self.prefix = _worker_prefix()
        self._owned: dict[str, Proxy] = {}
        self._seq = itertools.count(1)
        self._session = requests.Session()
        # No proxy variables, .netrc or CA bundles from the environment: the API is
        # plain HTTP to a server of our own (an HTTP_PROXY without NO_PROXY would
        # route it elsewhere), and reading them costs about 1 ms of CPU per call.
        self._session.trust_env = False

    @classmethod
    def start(cls, prefer: Prefer = "auto") -> Toxiproxy:
        """Find or start a server (``chaos.launcher.launch``) and wrap it."""
        lease = launch(prefer)
        return cls(lease.host, lease.port, lease=lease)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kind(self) -> str:
        """``external``, ``binary`` or ``embedded`` (``external`` when built by hand)."""
        return self.lease.kind if self.lease is not None else "external"

    # -- raw calls ------------------------------------------------------------

    @contextlib.contextmanager
    def _client(self) -> Iterator[type[Any]]:
        """``APIConsumer`` aimed at this handle's server, over its session (hold the lock)."""
        with _API_LOCK:
            before = APIConsumer.host, APIConsumer.port, _client.requests
            APIConsumer.host, APIConsumer.port = self.host, self.port
            _client.requests = self._session
            try:
                yield APIConsumer
            finally:
                APIConsumer.host, APIConsumer.port, _client.requests = before

    @contextlib.contextmanager
    def _api(self, what: str) -> Iterator[type[Any]]:
        with self._client():
            try:
                yield APIConsumer
            except (NotFound, ProxyExists, InvalidToxic) as exc:
                # toxiproxy-python maps 404/409/400 to these classes (400 is always
                # "InvalidToxic", even for a proxy): report the status code instead.
                code = _STATUS_OF[type(exc)]
                raise ToxiproxyError(f"{what}: HTTP {code}: {_text(exc)}") from exc
            except OSError as exc:  # requests' ConnectionError/Timeout derive from OSError
                hint = _HUNG_HINT if isinstance(exc, requests.Timeout) else ""
                raise FaultProxyStopped(
                    self.describe_stop(f"{what}: {_reason(exc)}{hint}")) from exc

    def describe_stop(self, cause: str) -> str:
        """Why the server does not answer (see ``ServerLease.describe_stop``)."""
        if self.lease is not None:
            return self.lease.describe_stop(cause)
        return (f"the fault proxy at {self.url} (external server) stopped answering "
                f"({cause}); not started by this run, so no exit status")

    def problem(self, timeout: float = 10.0) -> str | None:
        """``None`` while the server answers ``GET /version`` within ``timeout``; else
        the account of its stop, for a run error (used after a failure to tell a dead
        proxy from a defect of the implementation; the timeout is generous, since a
        live server that answers late on a loaded machine must not turn a real
        failure into a run error)."""
        process = self.lease.process if self.lease is not None else None
        if process is not None and process.poll() is not None:
            return self.describe_stop("its process exited")
        with self._client():
            try:
                resp = APIConsumer.get("/version", timeout=timeout)
            except OSError as exc:
                return self.describe_stop(f"GET /version: {_reason(exc)}")
        if resp.status_code != 200:
            return self.describe_stop(f"GET /version: HTTP {resp.status_code}")
        return None

    def ensure_up(self) -> None:
        """Raise :class:`FaultProxyStopped` unless the server answers (see :meth:`problem`)."""
        problem = self.problem()
        if problem is not None:
            raise FaultProxyStopped(problem)

    def request(self, method: str, path: str, body: object = None) -> Any:
        """One API call; returns the decoded JSON (None for 204). Raises ``ToxiproxyError``."""
        what = f"{method} {path}"
        with self._api(what) as api:
            if method == "GET":
                resp = api.get(path, timeout=self.http_timeout_s)
            elif method == "POST":
                resp = api.post(path, json=body, timeout=self.http_timeout_s)
            elif method == "DELETE":
                resp = api.delete(path, timeout=self.http_timeout_s)
            else:
                raise ValueError(f"unsupported method {method!r}")
        if resp.status_code == 503:
            # toxiproxy-server's own handler timeout: the call hung inside the server.
            raise FaultProxyStopped(self.describe_stop(
                f"{what}: HTTP 503 {resp.text.strip()[:200]}{_HUNG_HINT}"))
        if resp.status_code >= 300:
            raise ToxiproxyError(f"{what}: HTTP {resp.status_code}: {resp.text.strip()}")
        return resp.json() if resp.content else None

    # -- server-wide ------------------------------------------------------------

    def version(self) -> str:
        data = self.request("GET", "/version")
        return str(data["version"]) if isinstance(data, dict) else str(data)

    def create_proxy(
        self,
        name: str,
        upstream: str,
        *,
        listen: str = "127.0.0.1:0",
        enabled: bool = True,
    ) -> Proxy:
        """Create a proxy named ``<prefix><name>`` (unique per process) and return it."""
        full = f"{self.prefix}{name}"
        data = self.request(
            "POST",
            "/proxies",
            {"name": full, "upstream": upstream, "listen": listen, "enabled": enabled},
        )
        proxy = Proxy(self, ProxyInfo.from_json(data))
        self._owned[full] = proxy
        return proxy

    def unique_name(self, stem: str) -> str:
        """``stem`` plus a counter: for callers creating many proxies."""
        return f"{stem}_{next(self._seq)}"

    def proxies(self) -> list[Proxy]:
        """The proxies this handle created and has not destroyed."""
        return list(self._owned.values())

    def reset(self) -> None:
        """Remove all toxics from and re-enable this handle's proxies."""
        for proxy in self.proxies():
            try:
                info = proxy.info()
            except ToxiproxyError as exc:
                if isinstance(exc.__cause__, NotFound):  # deleted behind our back
                    self._forget(proxy.name)
                    continue
                raise
            # Newest first: toxiproxy-server 2.12.0 can crash when a toxic goes
            # from in front of another one (docs/chaos.md, its AddToxic panic).
            for toxic in reversed(info.toxics):
                proxy.remove_toxic(toxic.name)
            if not info.enabled:
                proxy.enable()

    def destroy_all(self) -> None:
        """Delete every proxy this handle created (missing ones are ignored)."""
        for proxy in self.proxies():
            proxy.destroy()

    def stop(self) -> None:
        """Destroy our proxies (best effort) and stop the server if we started it."""
        with contextlib.suppress(ToxiproxyError, FaultProxyStopped):
            self.destroy_all()
        self._owned.clear()
        self._session.close()
        if self.lease is not None:
            self.lease.stop()

    def _forget(self, name: str) -> None:
        self._owned.pop(name, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Proxy:
    """Handle on one proxy of a ``Toxiproxy`` server."""

    def __init__(self, server: Toxiproxy, info: ProxyInfo) -> None:
        self._server = server
        self.name = info.name
        self.upstream = info.upstream
        self.listen = info.listen

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def _path(self) -> str:
        return f"/proxies/{self.name}"

    def info(self) -> ProxyInfo:
        return ProxyInfo.from_json(self._server.request("GET", self._path))

    def toxics(self) -> list[ToxicInfo]:
        data = self._server.request("GET", f"{self._path}/toxics")
        return [ToxicInfo.from_json(t) for t in data]

    def add_toxic(
        self,
        type: ToxicType,
        *,
        stream: StreamName = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: int,
    ) -> ToxicInfo:
        """Add a toxic (name defaults to ``<type>_<stream>``); attributes as keywords."""
        body = {
            "name": name or f"{type}_{stream}",
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        return ToxicInfo.from_json(self._server.request("POST", f"{self._path}/toxics", body))

    def update_toxic(
        self, name: str, *, toxicity: float | None = None, **attributes: int
    ) -> ToxicInfo:
        """Change some attributes (others keep their values) and/or the toxicity."""
        body: dict[str, object] = {"attributes": attributes}
        if toxicity is not None:
            body["toxicity"] = toxicity
        data = self._server.request("POST", f"{self._path}/toxics/{name}", body)
        return ToxicInfo.from_json(data)

    def remove_toxic(self, name: str) -> None:
        self._server.request("DELETE", f"{self._path}/toxics/{name}")

    def disable(self) -> None:
        """Stop listening and drop every live connection (a hard partition)."""
        self._set_enabled(False)

    def enable(self) -> None:
        """Listen again on the same address."""
        self._set_enabled(True)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[Self]:
        """Disabled inside the block, enabled again after it."""
        self.disable()
        try:
            yield self
        finally:
            self.enable()

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[Self]:
        """A silent partition inside the block.

        ``timeout`` toxics with timeout 0 on both streams: bytes are dropped and
        nothing is closed. Leaving the block removes them, which (as in toxiproxy)
        closes the connections they held; new connections flow normally.
        """
        names = ("partition_upstream", "partition_downstream")
        self.add_toxic("timeout", stream="upstream", name=names[0], timeout=0)
        try:
            self.add_toxic("timeout", stream="downstream", name=names[1], timeout=0)
            yield self
        finally:
            for name in names:
                with contextlib.suppress(ToxiproxyError):
                    self.remove_toxic(name)

    def _set_enabled(self, enabled: bool) -> None:
        info = ProxyInfo.from_json(self._server.request("POST", self._path, {"enabled": enabled}))
        self.listen = info.listen

    def destroy(self) -> None:
        """Delete the proxy (its listener and connections go with it); idempotent."""
        try:
            self._server.request("DELETE", self._path)
        except ToxiproxyError as exc:
            if not isinstance(exc.__cause__, NotFound):
                raise
        finally:
            self._server._forget(self.name)

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, listen={self.listen!r}, upstream={self.upstream!r})"


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else ""
    if isinstance(arg, bytes):
        return arg.decode("utf-8", "replace").strip()
    return str(arg).strip()


def _reason(exc: BaseException) -> str:
    """The innermost reason of a requests/urllib3 connection error, in one line."""
    inner: BaseException = exc
    for _ in range(5):
        nxt = inner.__context__ or (inner.args[0] if inner.args and
                                    isinstance(inner.args[0], BaseException) else None)
        if nxt is None:
            break
        inner = nxt
    text = str(inner) or type(inner).__name__
    return " ".join(text.split())[:300]
