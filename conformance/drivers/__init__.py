"""The driver bridge: implementations in any language, as child processes.

``--driver CMD`` (CLI), ``--zmq-driver CMD`` (plugin) or ``zmq_driver = CMD``
(ini) names a command instead of ``MODULE:ATTR``. The suite starts that
command as a driver process for every implementation object it would build
in-process, and talks to it over the protocol of ``docs/drivers.md``
(length-prefixed MessagePack on stdin/stdout).

:func:`driver_spec` is the whole entry point. It starts one driver,
checks its hello (a bad one is a one-line :class:`~conformance.errors.ConfigError`),
and builds the contract's spec from a proxy factory
(:attr:`conformance.contracts.Contract.driver`). The suites then run
unchanged: the proxies satisfy each family's duck-typed interface.

Modules: :mod:`.protocol` (frames, hello), :mod:`.process` (processes,
pool, crashes, resources), :mod:`.remote` (what every proxy shares; each family's
proxies live in its package, ``conformance/contracts/<family>/driver.py``),
:mod:`.behaviours` (a callable a driver runs by name), :mod:`.python`
(the Python driver's loop, ``python -m conformance.drivers.python MODULE:ATTR``)
and :mod:`.serving` (what the Python driver's per-contract services share;
each family's service is in its ``service.py``, named by the registry's
``python_service``).

Importing this package costs nothing: its names are loaded when first used.
The Python driver imports :mod:`.protocol` and :mod:`.serving` in every
driver process, and must not pay for the bridge (subprocesses, the
watchdog, pytest) each time the suite starts a node.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from conformance.contracts import Contract
    from conformance.drivers.process import (
        DriverCrashed,
        DriverGone,
        DriverPaused,
        DriverStartError,
        end_test,
        live_pids,
        shutdown,
    )

__all__ = [
    "ENV_DRIVER",
    "DriverCrashed",
    "DriverGone",
    "DriverPaused",
    "DriverStartError",
    "driver_spec",
    "end_test",
    "find_crashed",
    "is_driver_factory",
    "live_pids",
    "shutdown",
]

#: Environment variable naming a driver command (beaten by the option and the ini).
ENV_DRIVER: Final = "ZMQ_CONFORMANCE_DRIVER"

#: The names this package re-exports from :mod:`.process`, loaded on first use.
_FROM_PROCESS: Final = frozenset({"DriverCrashed", "DriverGone", "DriverPaused",
                                  "DriverStartError", "end_test", "live_pids", "shutdown"})


def __getattr__(name: str) -> Any:
    if name in _FROM_PROCESS:
        value = getattr(importlib.import_module("conformance.drivers.process"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def driver_spec(contract: Contract, command: str, *,
                overrides: Mapping[str, Any] | None = None,
                option: str = "--zmq-driver") -> Any:
    """The spec of ``contract`` for the implementation behind driver ``command``.

    Starts one driver (kept for reuse) to read its hello. Every problem is a
    one-line :class:`ConfigError` that names ``option``.
    """
    from conformance.contracts import resolve
    from conformance.errors import ConfigError

    if not contract.driver:
        raise ConfigError(f"{option}: the contract {contract.name!r} has no driver bridge yet")
    try:
        from conformance.drivers.process import probe

        hello = probe(command, contract.name)
        factory = resolve(contract.driver)(command, hello)
        label = f"driver {command}" + (f" ({hello.implementation})" if hello.implementation
                                       else "")
        return contract.spec_builder()(factory, name=label, overrides=overrides,
                                       origin="--zmq-capability")
    except ConfigError as exc:
        raise type(exc)(f"{option}: {exc}") from None


def is_driver_factory(factory: Any) -> bool:
    """True for the proxy factories of this package (their processes are counted)."""
    return bool(getattr(factory, "resources_counted", False))


def find_crashed(exc: BaseException | None) -> DriverCrashed | None:
    """The :class:`DriverCrashed` in ``exc``, its exception groups or its cause chain."""
    from conformance.drivers.process import DriverCrashed

    seen: set[int] = set()
    pending: list[BaseException] = [exc] if exc is not None else []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DriverCrashed):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return None
