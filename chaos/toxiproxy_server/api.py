"""The toxiproxy HTTP API on aiohttp: routes, JSON shapes and status codes.

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
known path with another method an empty 405.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from chaos.toxiproxy_server import gojson
from chaos.toxiproxy_server.errors import ApiError, bad_request
from chaos.toxiproxy_server.proxy import ProxyCollection
from chaos.toxiproxy_server.toxics import parse_new_toxic, parse_toxic_update

#: Version reported by ``GET /version``: the toxiproxy API level it follows.
VERSION = "2.12.0-zmq-conformance-embedded"

_COLLECTION: web.AppKey[ProxyCollection] = web.AppKey("collection", ProxyCollection)
_LOCK: web.AppKey[asyncio.Lock] = web.AppKey("lock", asyncio.Lock)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=gojson.dumps(data), status=status, content_type="application/json")


def _http_error(text: str, status: int) -> web.Response:
    """Go's ``http.Error``: plain text, a newline appended, no sniffing."""
    resp = web.Response(body=(text + "\n").encode(), status=status)
    resp.headers["Content-Type"] = "text/plain; charset=utf-8"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


async def _body(request: web.Request) -> object:
    raw = await request.read()
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


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return _http_error("User agent not allowed", 403)
    try:
        async with request.app[_LOCK]:
            return await handler(request)
    except ApiError as exc:
        return _http_error(gojson.dumps(exc.to_json()).decode(), exc.status)
    except web.HTTPMethodNotAllowed:
        return web.Response(status=405)
    except web.HTTPNotFound:
        return _http_error("404 page not found", 404)


async def _version(request: web.Request) -> web.Response:
    body = f'{{"version": {gojson.dumps(VERSION).decode()}}}\n'.encode()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = "application/json;charset=utf-8"
    return resp


async def _proxy_index(request: web.Request) -> web.Response:
    proxies = sorted(request.app[_COLLECTION].all(), key=lambda p: p.name)  # a Go map
    return _json({p.name: p.to_json() for p in proxies})


async def _proxy_create(request: web.Request) -> web.Response:
    body = _object(await _body(request))
    proxy = await request.app[_COLLECTION].create(
        _str_field(body, "name", ""),
        _str_field(body, "listen", ""),
        _str_field(body, "upstream", ""),
        enabled=_bool_field(body, "enabled", True),
    )
    return _json(proxy.to_json(), 201)


async def _populate(request: web.Request) -> web.Response:
    done: list[object] = []
    try:
        specs = _populate_specs(await _body(request))
        collection = request.app[_COLLECTION]
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


async def _proxy_show(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    return _json(proxy.to_json())


async def _proxy_update(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    body = _object(await _body(request))
    await proxy.update(
        listen=_str_field(body, "listen", proxy.listen),
        upstream=_str_field(body, "upstream", proxy.upstream),
        enabled=_bool_field(body, "enabled", proxy.enabled),
    )
    return _json(proxy.to_json())


async def _proxy_delete(request: web.Request) -> web.Response:
    await request.app[_COLLECTION].remove(request.match_info["proxy"])
    return web.Response(status=204)


async def _toxic_index(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    return _json([t.to_json() for t in proxy.toxics()])


async def _toxic_create(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    toxic = parse_new_toxic(await _body(request))
    proxy.add_toxic(toxic)
    return _json(toxic.to_json())


async def _toxic_show(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    return _json(proxy.get_toxic(request.match_info["toxic"]).to_json())


async def _toxic_update(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    current = proxy.get_toxic(request.match_info["toxic"])
    updated = parse_toxic_update(current, await _body(request))
    proxy.update_toxic(updated)
    return _json(updated.to_json())


async def _toxic_delete(request: web.Request) -> web.Response:
    proxy = request.app[_COLLECTION].get(request.match_info["proxy"])
    proxy.remove_toxic(request.match_info["toxic"])
    return web.Response(status=204)


async def _reset(request: web.Request) -> web.Response:
    await request.app[_COLLECTION].reset()
    return web.Response(status=204)


def build_app(collection: ProxyCollection) -> web.Application:
    """The aiohttp application serving ``collection``.

    Requests are serialised with one lock: every handler is quick (no
    handler waits on proxied traffic), and it keeps proxy state changes
    atomic with respect to each other.
    """
    app = web.Application(middlewares=[_errors])
    app[_COLLECTION] = collection
    app[_LOCK] = asyncio.Lock()
    app.router.add_get("/version", _version)
    app.router.add_post("/reset", _reset)
    app.router.add_get("/proxies", _proxy_index)
    app.router.add_post("/proxies", _proxy_create)
    app.router.add_post("/populate", _populate)
    app.router.add_get("/proxies/{proxy}", _proxy_show)
    app.router.add_post("/proxies/{proxy}", _proxy_update)
    app.router.add_patch("/proxies/{proxy}", _proxy_update)
    app.router.add_delete("/proxies/{proxy}", _proxy_delete)
    app.router.add_get("/proxies/{proxy}/toxics", _toxic_index)
    app.router.add_post("/proxies/{proxy}/toxics", _toxic_create)
    app.router.add_get("/proxies/{proxy}/toxics/{toxic}", _toxic_show)
    app.router.add_post("/proxies/{proxy}/toxics/{toxic}", _toxic_update)
    app.router.add_patch("/proxies/{proxy}/toxics/{toxic}", _toxic_update)
    app.router.add_delete("/proxies/{proxy}/toxics/{toxic}", _toxic_delete)
    return app
