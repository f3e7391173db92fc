"""Fixtures of the engine-pipeline suite: the implementation under test (``pipeline_spec``).

``pipeline_spec`` is the implementation the session configured
(``--zmq-contract engine-pipeline --zmq-transport MODULE:ATTR``, or the
user's ``zmq_transport_factory`` fixture); ``ZMQ_CONFORMANCE_ENGINE_PIPELINE``
(``MODULE:ATTR``) overrides it; without either it is the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conformance.config.fixtures import contract_spec
from conformance.contracts.engine_pipeline.harness import Rig
from conformance.contracts.engine_pipeline.spec import PipelineSpec, load

#: Environment variable naming an implementation, beating the configuration.
ENV_TARGET = "ZMQ_CONFORMANCE_ENGINE_PIPELINE"
CONTRACT = "engine-pipeline"


@pytest.fixture
def pipeline_spec(request: pytest.FixtureRequest, zmq_transport_factory: Any) -> PipelineSpec:
    """The engine-pipeline implementation under test."""
    spec: PipelineSpec = contract_spec(request, zmq_transport_factory, CONTRACT,
                                    env=ENV_TARGET, load=load)
    return spec


@pytest.fixture
def rig(pipeline_spec: PipelineSpec, tmp_path: Any) -> Iterator[Rig]:
    """Clients, engine processes and raw peers of one test; all of it ends with the test."""
    with Rig(pipeline_spec, tmp_path) as r:
        yield r
