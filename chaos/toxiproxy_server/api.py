"""The toxiproxy HTTP API: routes, JSON shapes and status codes.

Endpoints and codes (as toxiproxy 2.x): ``GET /version`` 200
``{"version": ...}``; ``GET /proxies`` 200 ``{name: proxy}``; ``POST
/proxies`` 201 proxy, 409 duplicate, 400 missing name/upstream or bad
body; ``POST /populate`` 201 ``{"proxies": [...]}``; ``GET|POST|PATCH
/proxies/{proxy}`` 200 proxy; ``DELETE /proxies/{proxy}`` 204; ``GET
/proxies/{proxy}/toxics`` 200 list; ``POST /proxies/{proxy}/toxics`` 200
toxic (toxiproxy answers 200, not 201, here), 409 duplicate name, 400 bad
type/stream/attributes; ``GET|POST|PATCH /proxies/{proxy}/toxics/{toxic}``
200 toxic; ``DELETE .../toxics/{toxic}`` 204; ``POST /reset`` 204. Unknown
proxy or toxic: 404. Errors are ``{"error": message, "status": code}``.
Requests from browsers (User-Agent ``Mozilla/...``) get 403, as in
toxiproxy, so a web page cannot drive the API.

Answers are the real server's bytes (``api.go``), not just the same JSON
values: bodies are Go-marshalled (:mod:`gojson`: struct field order, map
keys sorted, ``toxicity`` a ``float32`` written ``1`` or ``0.5``); an error
goes through Go's ``http.Error``, so it is ``text/plain`` with a trailing
newline; ``/populate`` answers every outcome, errors included, as one
object ``{"error", "status", "proxies"}`` (``proxies`` is ``null`` when
none was made); ``/version`` is written by hand as ``{"version": "V"}`` and
a newline; an unknown path gets gorilla/mux's ``404 page not found``, a
known path with another method an empty 405, and a path that is not clean
(``//version``, ``/proxies/a/../b``) mux's ``301`` to the cleaned one. As in
mux, the browser check runs only for a matched route.

Requests come from :mod:`chaos.toxiproxy_server.http_server`; handlers are
serialised by one lock (every handler is quick, no handler waits on proxied
traffic, and it keeps proxy state changes atomic with respect to each other).
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import urllib.parse
from collections.abc import Awaitable, Callable

from chaos.toxiproxy_server import gojson
from chaos.toxiproxy_server.errors import ApiError, bad_request
from chaos.toxiproxy_server.http_server import Request, Response
from chaos.toxiproxy_server.proxy import ProxyCollection
from chaos.toxiproxy_server.toxics import parse_new_toxic, parse_toxic_update

#: Version reported by ``GET /version``: the toxiproxy API level it follows.
VERSION = "2.12.0-zmq-conformance-embedded"

_JSON = [("Content-Type", "application/json")]
_TEXT = [("Content-Type", "text/plain; charset=utf-8"), ("X-Content-Type-Options", "nosniff")]

#: A matched route's handler: the collection, the path's variables, the request. Those
#: that change listeners (create, update, delete, populate, reset) are coroutines.
RouteHandler = Callable[
    [ProxyCollection, dict[str, str], Request], "Response | Awaitable[Response]"
]


def _json(data: object, status: int = 200) -> Response:
    return Response(status, _JSON, gojson.dumps(data))


def _http_error(text: str, status: int) -> Response:
    """Go's ``http.Error``: plain text, a newline appended, no sniffing."""
    return Response(status, _TEXT, (text + "\n").encode())


def _body(request: Request) -> object:
    raw = request.body
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(str(exc) if raw else "EOF") from None


def _str_field(body: dict[str, object], key: str, default: str) -> str:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string, got {value!r}")
    return value


def _bool_field(body: dict[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{key} must be a boolean, got {value!r}")
    return value


def _object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    return body


def _version(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    body = f'{{"version": {gojson.dumps(VERSION).decode()}}}\n'.encode()
    return Response(200, [("Content-Type", "application/json;charset=utf-8")], body)


def _proxy_index(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxies = sorted(collection.all(), key=lambda p: p.name)  # a Go map
    return _json({p.name: p.to_json() for p in proxies})


async def _proxy_create(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    body = _object(_body(request))
    proxy = await collection.create(
        _str_field(body, "name", ""),
        _str_field(body, "listen", ""),
        _str_field(body, "upstream", ""),
        enabled=_bool_field(body, "enabled", True),
    )
    return _json(proxy.to_json(), 201)


async def _populate(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    done: list[object] = []
    try:
        specs = _populate_specs(_body(request))
        for name, listen, upstream, enabled in specs:
            proxy = await collection.add_or_replace(name, listen, upstream, enabled=enabled)
            done.append(proxy.to_json())
    except ApiError as exc:
        # The proxies made before the failure stay, and are listed with the error.
        answer = {**exc.to_json(), "proxies": done or None}
        return _json(answer, exc.status)
    return _json({"proxies": done or None}, 201)


def _populate_specs(body: object) -> list[tuple[str, str, str, bool]]:
    """Validate a whole ``/populate`` body before any proxy is made."""
    if not isinstance(body, list):
        raise bad_request("expected a JSON array of proxies")
    specs: list[tuple[str, str, str, bool]] = []
    for i, item in enumerate(body, start=1):
        entry = _object(item)
        name = _str_field(entry, "name", "")
        upstream = _str_field(entry, "upstream", "")
        if not name:
            raise ApiError(f"missing required field: name at proxy {i}", 400)
        if not upstream:
            raise ApiError(f"missing required field: upstream at proxy {i}", 400)
        specs.append(
            (name, _str_field(entry, "listen", ""), upstream, _bool_field(entry, "enabled", True))
        )
    return specs


def _proxy_show(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    return _json(collection.get(params["proxy"]).to_json())


async def _proxy_update(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    body = _object(_body(request))
    await proxy.update(
        listen=_str_field(body, "listen", proxy.listen),
        upstream=_str_field(body, "upstream", proxy.upstream),
        enabled=_bool_field(body, "enabled", proxy.enabled),
    )
    return _json(proxy.to_json())


async def _proxy_delete(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    await collection.remove(params["proxy"])
    return Response(204)


def _toxic_index(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    return _json([t.to_json() for t in proxy.toxics()])


def _toxic_create(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    toxic = parse_new_toxic(_body(request))
    proxy.add_toxic(toxic)
    return _json(toxic.to_json())


def _toxic_show(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    return _json(proxy.get_toxic(params["toxic"]).to_json())


def _toxic_update(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    current = proxy.get_toxic(params["toxic"])
    updated = parse_toxic_update(current, _body(request))
    proxy.update_toxic(updated)
    return _json(updated.to_json())


def _toxic_delete(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    proxy = collection.get(params["proxy"])
    proxy.remove_toxic(params["toxic"])
    return Response(204)


async def _reset(
    collection: ProxyCollection, params: dict[str, str], request: Request
) -> Response:
    await collection.reset()
    return Response(204)


_Routes = dict[str, RouteHandler]

_TOP: dict[str, _Routes] = {
    "version": {"GET": _version},
    "reset": {"POST": _reset},
    "proxies": {"GET": _proxy_index, "POST": _proxy_create},
    "populate": {"POST": _populate},
}
_PROXY: _Routes = {
    "GET": _proxy_show, "POST": _proxy_update, "PATCH": _proxy_update, "DELETE": _proxy_delete,
}
_TOXICS: _Routes = {"GET": _toxic_index, "POST": _toxic_create}
_TOXIC: _Routes = {
    "GET": _toxic_show, "POST": _toxic_update, "PATCH": _toxic_update, "DELETE": _toxic_delete,
}


def _match(path: str) -> tuple[_Routes, dict[str, str]] | None:
    """The routes of ``path`` (methods to handlers) and its variables, or None."""
    parts = path.split("/")
    if parts[0] != "" or len(parts) < 2:
        return None
    parts = parts[1:]
    if len(parts) == 1:
        routes = _TOP.get(parts[0])
        return (routes, {}) if routes is not None else None
    if parts[0] != "proxies" or not all(parts[1:]):  # mux variables are [^/]+
        return None
    if len(parts) == 2:
        return _PROXY, {"proxy": parts[1]}
    if parts[2] != "toxics":
        return None
    if len(parts) == 3:
        return _TOXICS, {"proxy": parts[1]}
    if len(parts) == 4:
        return _TOXIC, {"proxy": parts[1], "toxic": parts[3]}
    return None


def _clean(path: str) -> str:
    """gorilla/mux's ``cleanPath``: Go's ``path.Clean``, keeping a trailing slash."""
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    cleaned = posixpath.normpath(path)
    if cleaned.startswith("//"):  # POSIX keeps two leading slashes; Go does not
        cleaned = "/" + cleaned.lstrip("/")
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


class Api:
    """The toxiproxy API over ``collection``: one request in, one answer out.

    Handlers run one at a time: a handler that needs no waiting answers at
    once, unless a coroutine handler is running or waiting, in which case it
    queues behind it on the lock, so that no call sees another half done.
    """

    def __init__(self, collection: ProxyCollection) -> None:
        self._collection = collection
        self._lock = asyncio.Lock()
        self._in_flight = 0

    def __call__(self, request: Request) -> Response | Awaitable[Response]:
        raw_path, _, query = request.target.partition("?")
        path = urllib.parse.unquote(raw_path) if "%" in raw_path else raw_path
        cleaned = _clean(path)
        if cleaned != path:
            location = urllib.parse.quote(cleaned) + (f"?{query}" if query else "")
            return Response(301, [("Location", location)])
        matched = _match(path)
        if matched is None:
            return _http_error("404 page not found", 404)
        routes, params = matched
        handler = routes.get(request.method)
        if handler is None:
            return Response(405)
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            return _http_error("User agent not allowed", 403)
        if self._in_flight or asyncio.iscoroutinefunction(handler):
            return self._locked(handler, params, request)
        try:
            answer = handler(self._collection, params, request)
        except ApiError as exc:
            return _error(exc)
        assert isinstance(answer, Response)
        return answer

    async def _locked(
        self, handler: RouteHandler, params: dict[str, str], request: Request
    ) -> Response:
        self._in_flight += 1  # from its first step on: sync calls queue behind it
        try:
            async with self._lock:
                answer = handler(self._collection, params, request)
                return answer if isinstance(answer, Response) else await answer
        except ApiError as exc:
            return _error(exc)
        finally:
            self._in_flight -= 1


def _error(exc: ApiError) -> Response:
    return _http_error(gojson.dumps(exc.to_json()).decode(), exc.status)
