"""Choosing the transport under test from the pytest configuration.

Precedence (highest first): a ``zmq_transport_factory`` fixture the user
overrides; ``--zmq-transport MODULE:ATTR``; the ``zmq_transport`` ini option;
the ``ZMQ_CONFORMANCE_TRANSPORT`` environment variable; the reference
transport.
"""

from __future__ import annotations

import pytest

from conformance.spec import DEFAULT_TRANSPORT, TransportSpec, spec_from_path


def spec_from_config(config: pytest.Config) -> TransportSpec:
    # Placeholder until the plugin issue lands: always the reference transport.
    return spec_from_path(DEFAULT_TRANSPORT)
