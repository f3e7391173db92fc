"""Fixtures of the control chaos suite; ``toxiproxy`` comes from :mod:`chaos.fixtures`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.proxy import Toxiproxy
from conformance.contracts.control.faults import ChaosRig
from conformance.contracts.control.fixtures import control_spec
from conformance.contracts.control.spec import ControlSpec

__all__ = ["chaos_rig", "control_spec"]


@pytest.fixture
def chaos_rig(control_spec: ControlSpec, toxiproxy: Toxiproxy) -> Iterator[ChaosRig]:
    """A rig with the server behind a proxy (started); every fault healed afterwards."""
    with ChaosRig(control_spec, toxiproxy) as rig:
        rig.start_server()
        yield rig
