"""The process an engine under test runs in: ``python -m ...engine_host CONFIG``.

With ``"side": "client"`` it hosts a client instead (built with
``addresses`` and ``options``, made ready, "READY" printed, then idle until
killed): a client whose death the suite can cause. With ``"side":
"dies-in-startup"`` it is an engine (the suite's raw one, engine index
``engine_index``) that prints "CONNECTING" once it is imported, sends HELLO
to ``addresses[0]`` (queued until a client binds there), takes the WELCOME,
connects and sends its DEALER's first message, prints "WELCOMED" and never
says READY: with ``options["how"]`` ``"exit0"`` it then exits 0, with
``"sigkill"`` it waits for the suite's SIGKILL (PIPE-5's death during
startup, between HELLO and READY).

``CONFIG`` is a JSON object: ``factory`` (``MODULE:ATTR`` of the engine
factory), ``addresses``, ``engine_index``, ``model`` (options of
:class:`~reference_impl.engine_pipeline.model.FakeModel`) and ``options``
(keyword arguments for the factory). Options whose values are ``bytes``
(CURVE keys) come from the environment variable ``SECRET_OPTIONS_ENV``
instead (ASCII text, turned back into bytes; the variable is removed), so
no key is on a command line. An option ``log_level`` (``"DEBUG"``...) is the
host's own: it sends every log record to stderr at that level (the suite
reads it for leaked keys). The host builds the model and the
engine, then calls ``serve()``. Exit status: 0 when ``serve()`` returns,
:data:`FAILED` when building or serving raised (the traceback goes to
stderr). SIGTERM asks the engine to shut down (its ``shutdown()`` if it has
one, else ``SystemExit`` in ``serve()``). The host ends with the suite that
started it (``conformance.supervision.lifeline``). It prints "SERVING" on
stdout when the engine is built and ``serve()`` starts, so bounds on the
engine's own behaviour never include the interpreter's start-up.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any

from conformance.contract import resolve
from conformance.supervision.lifeline import bind_to_parent
from reference_impl.engine_pipeline.model import FakeModel

FAILED = 3
#: Same name as ``harness.SECRET_OPTIONS_ENV`` (not imported: the host stays light).
SECRET_OPTIONS_ENV = "ZMQ_CONFORMANCE_ENGINE_SECRET_OPTIONS"


def _options(config: dict[str, Any]) -> dict[str, Any]:
    """The factory's keyword arguments: the config's, the secret ones, ``log_level`` applied."""
    options = dict(config.get("options", {}))
    apply_log_level(options)
    secret = json.loads(os.environ.pop(SECRET_OPTIONS_ENV, "{}"))
    for name, value in secret.items():
        options[name] = ([v.encode("ascii") for v in value] if isinstance(value, list)
                         else value.encode("ascii"))
    return options


def apply_log_level(options: dict[str, Any]) -> None:
    """Take the host's own option ``log_level`` out of ``options`` and, when given, send
    every log record of this process to stderr at that level (shared with the Python
    driver, whose stderr is its log)."""
    level = options.pop("log_level", None)
    if level is not None:
        logging.basicConfig(level=str(level), stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    bind_to_parent()
    if config.get("side") == "client":
        return _client(config)
    if config.get("side") == "dies-in-startup":
        return _dies_in_startup(config)
    try:
        factory = resolve(config["factory"])
        model = FakeModel.from_options(config.get("model"))
        engine = factory(config["addresses"], engine_index=config["engine_index"], model=model,
                         **_options(config))
    except BaseException:
        traceback.print_exc()
        return FAILED

    stop_on_sigterm(engine)
    print("SERVING", flush=True)  # built: what follows is the engine's own time
    return serve(engine)


def stop_on_sigterm(engine: Any) -> None:
    """From now on SIGTERM asks ``engine`` to shut down (its ``shutdown()`` if it has one,
    else ``SystemExit`` in ``serve()``)."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop = getattr(engine, "shutdown", None)
        if callable(stop):
            stop()
        else:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)


def serve(engine: Any) -> int:
    """Run ``engine.serve()`` in this process; the exit status: 0 when ``serve()`` returns,
    :data:`FAILED` when it raised (the traceback goes to stderr). Shared with the Python
    driver, whose engine process is the driver process itself."""
    try:
        engine.serve()
    except SystemExit as exc:
        return int(exc.code or 0)
    except BaseException:
        traceback.print_exc()
        return FAILED
    return 0


def _client(config: dict[str, Any]) -> int:
    """A client in a process of its own: built, ready, then idle until killed."""
    try:
        client = resolve(config["factory"])(config["addresses"], **_options(config))
        client.wait_ready()
    except BaseException:
        traceback.print_exc()
        return FAILED
    print("READY", flush=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    while True:
        signal.pause()


def _dies_in_startup(config: dict[str, Any]) -> int:
    """An engine process that ends between its HELLO and its READY (module docstring)."""
    from conformance.contracts.engine_pipeline.peers import RawEngine

    how = config.get("options", {}).get("how")
    if how not in ("exit0", "sigkill"):
        print(f"dies-in-startup: options.how must be exit0 or sigkill, got {how!r}",
              file=sys.stderr)
        return FAILED
    engine = RawEngine(config["addresses"][0], engine_index=config["engine_index"])
    print("CONNECTING", flush=True)
    try:
        engine.join(float(config.get("options", {}).get("timeout_s", 60)), say_ready=False)
    except BaseException:
        traceback.print_exc()
        return FAILED
    print("WELCOMED", flush=True)
    if how == "exit0":
        os._exit(0)  # no teardown, no goodbye: the process is simply gone
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
