r"""Loading the implementation under test: ``MODULE:ATTR`` factories, checked against a contract.

Every contract's implementation is named ``MODULE:ATTR``; :func:`load_factory`
imports it with one-line :class:`ConfigError`\ s that name the option and the
value, :func:`check_fits` rejects a factory whose signature cannot take the
calls the contract's suite makes (a factory of another contract, usually), and
:func:`contract_spec_from_path` does both and builds the contract's spec with
the contract's own ``make_spec`` (named by the registry). :func:`accepts` and
:func:`takes` tell a family's spec which optional keywords a factory takes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from conformance.contracts import CONTRACTS, DEFAULT_CONTRACT, Contract
from conformance.errors import ConfigError

#: The default contract's reference implementation.
DEFAULT_TRANSPORT: Final = CONTRACTS[DEFAULT_CONTRACT].default_factory
ENV_TRANSPORT: Final = "ZMQ_CONFORMANCE_TRANSPORT"


def accepts(factory: Callable[..., Any], name: str) -> bool:
    """True when ``factory`` takes keyword ``name`` (or any keyword: ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def takes(factory: Callable[..., Any], name: str) -> bool:
    """True when ``factory`` names keyword ``name`` (``**kwargs`` does not count: some
    keywords go only to factories that say they understand them)."""
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def load_factory(path: str, *, option: str = "--zmq-transport",
                 objects: bool = False) -> Callable[..., Any]:
    """Resolve ``MODULE:ATTR`` (``ATTR`` may be dotted) to a callable.

    With ``objects`` (a contract whose implementation may be a plain object,
    :attr:`Contract.objects`) the target need not be callable.

    The current directory is importable, so a user's own checkout works
    without installing it. Errors are one-line :class:`ConfigError`s that name
    ``option`` and the value.
    """
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(
            f"{option}={path!r}: expected MODULE:ATTR, e.g. mypkg.transport:MyTransport"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{option}={path!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module raised while importing
        raise ConfigError(
            f"{option}={path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"{option}={path!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if not callable(target) and not objects:
        raise ConfigError(f"{option}={path!r}: {attr_path!r} is not callable")
    return target  # type: ignore[no-any-return]


def check_fits(factory: Callable[..., Any], contract: Contract, *, path: str,
               option: str) -> None:
    """Raise :class:`ConfigError` when ``factory`` cannot be called the way ``contract``'s
    suite calls it (a factory of another contract, usually).

    Only the signature is checked; a factory without one (a builtin) passes.
    """
    args, kwargs = contract.probe
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{option}={path!r} does not fit the contract {contract.name!r}, whose suite calls "
            f"{contract.factory_shape} ({exc}); pick the contract with --contract "
            f"({', '.join(CONTRACTS)})"
        ) from None


def contract_spec_from_path(contract: Contract, path: str, *,
                            overrides: Mapping[str, Any] | None = None,
                            option: str = "--zmq-transport") -> Any:
    """Load ``MODULE:ATTR``, check that it fits ``contract`` and build its spec."""
    factory = load_factory(path, option=option, objects=contract.objects)
    check_fits(factory, contract, path=path, option=option)
    return contract.spec_builder()(factory, name=path, overrides=overrides,
                                   origin="--zmq-capability")


def implementation_sides(
    factory: Any, sides: tuple[str, str], *, name: str | None
) -> tuple[str, Any, dict[str, Any]]:
    """Resolve an implementation object of a two-sided contract (control, engine pipeline).

    ``factory`` is the object with the ``sides`` factories as attributes, or a
    zero-argument callable returning one. Returns its label, the object and
    each side's factory (``None`` where it has none); a side that is not
    callable, or a callable that raises, is a :class:`ConfigError`.
    """
    label = name or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}"
    target = factory
    if not any(hasattr(target, side) for side in sides) and callable(target):
        try:
            target = target()
        except Exception as exc:
            raise ConfigError(f"{label}: calling it for the implementation raised "
                              f"{type(exc).__name__}: {exc}") from None
    found = {side: getattr(target, side, None) for side in sides}
    for side, side_factory in found.items():
        if side_factory is not None and not callable(side_factory):
            raise ConfigError(f"{label}: {side} is a {type(side_factory).__name__}, "
                              "not a factory")
    return label, target, found
