"""Choosing the transport, its capabilities and the suite paths from the configuration.

Both faces use this module: the pytest plugin reads the values from the pytest
configuration, the CLI from its own arguments, and both resolve them with the
same plain functions.

Transport precedence (highest first): a ``zmq_transport_factory`` fixture the
user overrides (handled in :mod:`conformance.fixtures`); ``--zmq-transport
MODULE:ATTR``; the ``zmq_transport`` ini option; the
``ZMQ_CONFORMANCE_TRANSPORT`` environment variable; the reference transport.

Capabilities a transport cannot declare itself come from the ini option
``zmq_capabilities`` (one ``name=value`` per line) and the repeatable option
``--zmq-capability name=value``; the command line wins over the ini file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance import process_nodes
from conformance.errors import ConfigError
from conformance.spec import (
    DEFAULT_TRANSPORT,
    ENV_TRANSPORT,
    Capabilities,
    TransportSpec,
    spec_from_path,
)

#: Packages whose directories hold the suite's tests.
SUITE_PACKAGE = "conformance.suite"
#: The chaos clause tests; collected only with ``--zmq-chaos``.
CHAOS_SUITE_PACKAGES = ("chaos.suite",)
#: Fixtures the chaos tests need (``toxiproxy``); registered with ``--zmq-chaos``.
CHAOS_FIXTURES = "chaos.fixtures"

_BOOL_FIELDS = frozenset(
    f.name for f in dataclasses.fields(Capabilities) if f.type in ("bool", "bool | None")
)
_FIELDS = frozenset(f.name for f in dataclasses.fields(Capabilities))
_OPTIONAL_FIELDS = frozenset(
    f.name for f in dataclasses.fields(Capabilities) if "None" in str(f.type)
)
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})

_SPEC_KEY = pytest.StashKey["TransportSpec"]()


def choose_transport(option: str | None, ini: str | None, env: str | None) -> tuple[str, str]:
    """Return ``(MODULE:ATTR, origin)`` by precedence; ``origin`` names the setting for errors."""
    if option:
        return option, "--zmq-transport"
    if ini:
        return ini, "ini zmq_transport"
    if env:
        return env, ENV_TRANSPORT
    return DEFAULT_TRANSPORT, "default transport"


def parse_capability(text: str, *, origin: str) -> tuple[str, Any]:
    """Parse one ``name=value`` capability setting into a typed pair.

    Boolean capabilities take ``true``/``false`` (also yes/no, on/off, 1/0);
    the others take an integer or ``none``. Errors are one-line
    :class:`ConfigError` naming ``origin`` and the value.
    """
    name, sep, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not name:
        raise ConfigError(f"{origin}={text!r}: expected NAME=VALUE, e.g. heartbeat_ivl_ms=1000")
    if name not in _FIELDS:
        raise ConfigError(
            f"{origin}={text!r}: unknown capability {name!r}; known: {', '.join(sorted(_FIELDS))}"
        )
    lowered = raw.lower()
    if name in _BOOL_FIELDS:
        if lowered in _TRUE:
            return name, True
        if lowered in _FALSE:
            return name, False
        raise ConfigError(f"{origin}={text!r}: capability {name!r} must be true or false")
    if lowered in ("none", "") and name in _OPTIONAL_FIELDS:
        return name, None
    try:
        return name, int(raw)
    except ValueError:
        raise ConfigError(f"{origin}={text!r}: capability {name!r} must be an integer") from None


def parse_capabilities(ini_lines: Iterable[str], options: Iterable[str]) -> dict[str, Any]:
    """Merge ini lines and command-line settings (the latter win) into checked overrides."""
    merged: dict[str, Any] = {}
    for origin, lines in (("zmq_capabilities", ini_lines), ("--zmq-capability", options)):
        for line in lines:
            if line.strip() and not line.strip().startswith("#"):
                name, value = parse_capability(line, origin=origin)
                merged[name] = value
    # Validate the combination (types, positivity) once, naming the options.
    Capabilities.from_mapping(
        {k: v for k, v in merged.items() if v is not None}, origin="capabilities"
    )
    return merged


def suite_paths(
    *, chaos: bool, explicit: Sequence[str] = (), base: Path | None = None
) -> list[Path]:
    """The directories collected as the suite.

    ``explicit`` (``--zmq-suite``) replaces the built-in suite, relative to
    ``base``. Otherwise the ``conformance.suite`` package, plus the chaos
    packages that exist when ``chaos`` is set.
    """
    if explicit:
        root = base or Path.cwd()
        paths = [(root / p).resolve() for p in explicit]
        for path in paths:
            if not path.exists():
                raise ConfigError(f"--zmq-suite={str(path)!r}: no such file or directory")
        return paths
    names = [SUITE_PACKAGE, *(CHAOS_SUITE_PACKAGES if chaos else ())]
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


def spec_from_config(config: pytest.Config) -> TransportSpec:
    """The configured transport (cached per session); errors become usage errors."""
    cached = config.stash.get(_SPEC_KEY, None)
    if cached is not None:
        return cached
    spec = build_spec(config)
    config.stash[_SPEC_KEY] = spec
    return spec


def build_spec(config: pytest.Config) -> TransportSpec:
    """Resolve the transport and capabilities of ``config``, raising :class:`ConfigError`."""
    path, origin = configured_transport(config)
    overrides = configured_capabilities(config)
    spec = spec_from_path(path, overrides=overrides, option=origin)
    return process_nodes.nodes_spec(spec, config.getoption("zmq_nodes", None),
                                    option="--zmq-nodes")


def configured_transport(config: pytest.Config) -> tuple[str, str]:
    ini = str(config.getini("zmq_transport") or "").strip()
    return choose_transport(config.getoption("zmq_transport"), ini, os.environ.get(ENV_TRANSPORT))


def configured_capabilities(config: pytest.Config) -> dict[str, Any]:
    ini_lines: list[str] = list(config.getini("zmq_capabilities") or [])
    options: list[str] = list(config.getoption("zmq_capability") or [])
    return parse_capabilities(ini_lines, options)
