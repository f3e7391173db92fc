"""Choosing the transport, its capabilities and the suite paths from the configuration.

Both faces use this module: the pytest plugin reads the values from the pytest
configuration, the CLI from its own arguments, and both resolve them with the
same plain functions.

The contract (:mod:`conformance.contracts`) comes from ``--zmq-contract
NAME``, then the ``zmq_contract`` ini option, then ``p2p``. The
implementation under test is the configured contract's; a suite of another
contract (collected by hand) tests that contract's reference.

Implementation precedence (highest first): a ``zmq_transport_factory``
fixture the user overrides (handled in :mod:`conformance.config.fixtures`);
``--zmq-transport MODULE:ATTR``; the ``zmq_transport`` ini option; the
``ZMQ_CONFORMANCE_TRANSPORT`` environment variable; the contract's reference.
A driver command (``--zmq-driver CMD``, ini ``zmq_driver``,
``ZMQ_CONFORMANCE_DRIVER``; :mod:`conformance.drivers`) takes the place of
``MODULE:ATTR`` at its level: it beats a transport set at a lower level, and
both set at the same level is an error.

Capabilities a transport cannot declare itself come from the ini option
``zmq_capabilities`` (one ``name=value`` per line) and the repeatable option
``--zmq-capability name=value``; the command line wins over the ini file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pytest is imported by the plugin's side; the CLI needs none of it
    import pytest

from conformance import contracts
from conformance.config.loading import DEFAULT_TRANSPORT, ENV_TRANSPORT, contract_spec_from_path
from conformance.contracts import DEFAULT_CONTRACT, Contract
from conformance.errors import ConfigError

__all__ = [
    "CHAOS_FIXTURES", "CHAOS_SUITE_PACKAGES", "SUITE_PACKAGE", "build_spec",
    "choose_transport", "configured_capabilities", "configured_contract",
    "configured_transport", "parse_capabilities", "parse_capability", "spec_from_config",
    "suite_paths", "with_nodes",
]

#: Packages whose directories hold the default contract's tests.
SUITE_PACKAGE = contracts.CONTRACTS[DEFAULT_CONTRACT].suite[0]
#: Its chaos clause tests; collected only with ``--zmq-chaos``.
CHAOS_SUITE_PACKAGES = contracts.CONTRACTS[DEFAULT_CONTRACT].chaos_suite
#: Fixtures the chaos tests need (``toxiproxy``); registered with ``--zmq-chaos``.
CHAOS_FIXTURES = "chaos.fixtures"

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})

_SPEC_KEY: Any = None


def _spec_key() -> pytest.StashKey[dict[str, Any]]:
    """The config stash key of the built specs (made on first use: it needs pytest)."""
    global _SPEC_KEY
    if _SPEC_KEY is None:
        import pytest

        _SPEC_KEY = pytest.StashKey[dict[str, Any]]()
    key: pytest.StashKey[dict[str, Any]] = _SPEC_KEY
    return key


def choose_transport(
    option: str | None, ini: str | None, env: str | None, default: str = DEFAULT_TRANSPORT
) -> tuple[str, str]:
    """Return ``(MODULE:ATTR, origin)`` by precedence; ``origin`` names the setting for errors."""
    if option:
        return option, "--zmq-transport"
    if ini:
        return ini, "ini zmq_transport"
    if env:
        return env, ENV_TRANSPORT
    return default, "default transport"


def parse_capability(
    text: str, *, origin: str, kind: type[Any] | None = None
) -> tuple[str, Any]:
    """Parse one ``name=value`` capability setting of dataclass ``kind`` (default: the
    default contract's capabilities) into a typed pair.

    Boolean capabilities take ``true``/``false`` (also yes/no, on/off, 1/0);
    text ones any value; the others an integer or ``none``. Errors are
    one-line :class:`ConfigError` naming ``origin`` and the value.
    """
    types = {f.name: str(f.type) for f in dataclasses.fields(kind or _default_capabilities())}
    name, sep, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not name:
        raise ConfigError(f"{origin}={text!r}: expected NAME=VALUE, e.g. heartbeat_ivl_ms=1000")
    if name not in types:
        raise ConfigError(
            f"{origin}={text!r}: unknown capability {name!r}; known: {', '.join(sorted(types))}"
        )
    lowered = raw.lower()
    if types[name].startswith("str"):
        return name, raw
    if types[name] in ("bool", "bool | None"):
        if lowered in _TRUE:
            return name, True
        if lowered in _FALSE:
            return name, False
        raise ConfigError(f"{origin}={text!r}: capability {name!r} must be true or false")
    if lowered in ("none", "") and "None" in types[name]:
        return name, None
    try:
        return name, int(raw)
    except ValueError:
        raise ConfigError(f"{origin}={text!r}: capability {name!r} must be an integer") from None


def parse_capabilities(
    ini_lines: Iterable[str], options: Iterable[str], *, kind: type[Any] | None = None
) -> dict[str, Any]:
    """Merge ini lines and command-line settings (the latter win) into checked overrides
    (of ``kind``, default: the default contract's capabilities)."""
    kind = kind or _default_capabilities()
    merged: dict[str, Any] = {}
    for origin, lines in (("zmq_capabilities", ini_lines), ("--zmq-capability", options)):
        for line in lines:
            if line.strip() and not line.strip().startswith("#"):
                name, value = parse_capability(line, origin=origin, kind=kind)
                merged[name] = value
    # Validate the combination (types, positivity) once, naming the options.
    kind.from_mapping(
        {k: v for k, v in merged.items() if v is not None}, origin="capabilities"
    )
    return merged


def _default_capabilities() -> type[Any]:
    return contracts.CONTRACTS[DEFAULT_CONTRACT].capability_type()


def suite_paths(
    *, chaos: bool, explicit: Sequence[str] = (), base: Path | None = None,
    contract: str = DEFAULT_CONTRACT,
) -> list[Path]:
    """The directories collected as the suite.

    ``explicit`` (``--zmq-suite``) replaces the built-in suite, relative to
    ``base``. Otherwise ``contract``'s suite packages, plus its chaos
    packages when ``chaos`` is set.
    """
    if explicit:
        root = base or Path.cwd()
        paths = [(root / p).resolve() for p in explicit]
        for path in paths:
            if not path.exists():
                raise ConfigError(f"--zmq-suite={str(path)!r}: no such file or directory")
        return paths
    chosen = contracts.get(contract)
    names = [*chosen.suite, *(chosen.chaos_suite if chaos else ())]
    return [path for name in names for path in _package_dirs(name)]


def _package_dirs(name: str) -> list[Path]:
    import importlib.util

    try:
        module_spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if module_spec is None or not module_spec.submodule_search_locations:
        return []
    return [Path(p).resolve() for p in module_spec.submodule_search_locations]


def configured_contract(config: pytest.Config) -> Contract:
    """The contract of this session: ``--zmq-contract``, ini ``zmq_contract``, ``p2p``."""
    option = config.getoption("zmq_contract", None)
    if option:
        return contracts.get(option, option="--zmq-contract")
    ini = str(config.getini("zmq_contract") or "").strip()
    if ini:
        return contracts.get(ini, option="ini zmq_contract")
    return contracts.CONTRACTS[DEFAULT_CONTRACT]


def spec_from_config(config: pytest.Config, contract: str | None = None) -> Any:
    """The implementation under test for ``contract`` (default: the session's), cached
    per session; errors are :class:`ConfigError`.

    For the session's contract that is the configured implementation; for
    another contract (its suite collected by hand) that contract's reference.
    """
    cache = config.stash.setdefault(_spec_key(), {})
    session = configured_contract(config)
    name = contract or session.name
    if name not in cache:
        cache[name] = build_spec(config, contracts.get(name))
    return cache[name]


def build_spec(config: pytest.Config, contract: Contract | None = None) -> Any:
    """Resolve the implementation and capabilities of ``config``, raising :class:`ConfigError`."""
    session = configured_contract(config)
    contract = contract or session
    if contract.name == session.name:
        path, origin = configured_transport(config)
        overrides = configured_capabilities(config)
        driver = configured_driver(config, transport_origin=origin)
        if driver is not None:
            from conformance.drivers import driver_spec

            command, driver_origin = driver
            spec = driver_spec(contract, command, overrides=overrides, option=driver_origin)
            return with_nodes(config, contract, spec)
    else:
        path, origin, overrides = contract.default_factory, "default transport", {}
    spec = contract_spec_from_path(contract, path, overrides=overrides, option=origin)
    return with_nodes(config, contract, spec)


def with_nodes(config: pytest.Config, contract: Contract, spec: Any) -> Any:
    """Apply ``--zmq-nodes`` to ``spec``: process nodes exist for the contracts whose
    registry entry names a ``nodes`` hook only."""
    mode = config.getoption("zmq_nodes", None)
    if contract.nodes is not None:
        nodes_spec = contracts.resolve(contract.nodes)
        return nodes_spec(spec, mode, option="--zmq-nodes")
    if mode not in (None, "inprocess"):
        able = ", ".join(c.name for c in contracts.CONTRACTS.values() if c.nodes is not None)
        raise ConfigError(
            f"--zmq-nodes={mode}: nodes in their own processes exist for the "
            f"{able} contract only, not {contract.name}"
        )
    return spec


def configured_transport(config: pytest.Config) -> tuple[str, str]:
    ini = str(config.getini("zmq_transport") or "").strip()
    return choose_transport(
        config.getoption("zmq_transport"), ini, os.environ.get(ENV_TRANSPORT),
        default=configured_contract(config).default_factory,
    )


_LEVELS = {"--zmq-transport": 0, "--zmq-driver": 0, "ini zmq_transport": 1,
           "ini zmq_driver": 1, ENV_TRANSPORT: 2}


def configured_driver(config: pytest.Config, *,
                      transport_origin: str) -> tuple[str, str] | None:
    """``(command, origin)`` of the configured driver when it beats the transport setting."""
    from conformance.drivers import ENV_DRIVER

    option = config.getoption("zmq_driver", None)
    ini = str(config.getini("zmq_driver") or "").strip()
    env = os.environ.get(ENV_DRIVER, "").strip()
    if option:
        found = (str(option), "--zmq-driver")
    elif ini:
        found = (ini, "ini zmq_driver")
    elif env:
        found = (env, ENV_DRIVER)
    else:
        return None
    level = _LEVELS.get(found[1], 2)
    other = _LEVELS.get(transport_origin, 3)
    if level == other:
        raise ConfigError(f"{found[1]} and {transport_origin} both name the implementation "
                          "under test; give one of them")
    return found if level < other else None


def configured_capabilities(config: pytest.Config) -> dict[str, Any]:
    ini_lines: list[str] = list(config.getini("zmq_capabilities") or [])
    options: list[str] = list(config.getoption("zmq_capability") or [])
    kind = configured_contract(config).capability_type()
    return parse_capabilities(ini_lines, options, kind=kind)
