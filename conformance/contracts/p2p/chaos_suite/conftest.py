"""Fixtures of the chaos suite: a chaos cluster per test on the worker's toxiproxy.

``toxiproxy`` comes from :mod:`chaos.fixtures` (registered by the plugin
with ``--zmq-chaos``, or with ``-p chaos.fixtures``), ``zmq_transport_spec``
from the conformance plugin.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.proxy import Toxiproxy
from conformance.contracts.p2p.spec import TransportSpec
from conformance.contracts.p2p.topology import ChaosCluster


@pytest.fixture
def chaos_cluster(
    zmq_transport_spec: TransportSpec, toxiproxy: Toxiproxy
) -> Iterator[ChaosCluster]:
    """An empty :class:`ChaosCluster`; its faults are healed and proxies deleted after the test."""
    with ChaosCluster(zmq_transport_spec, toxiproxy) as cluster:
        yield cluster
