"""Engine-pipeline clients with one defect each, for running in a driver process.

Served by the Python driver (``python -m conformance.drivers.python
broken_pipeline_clients:NAME``, with this directory on ``PYTHONPATH``), each
is the reference with a client that breaks one clause *inside the driver
process*, where the test process cannot see it: the proof that PIPE-6 and
PIPE-13 judge a client's own process, not only the suite's.

- ``THREAD_LEFT``: the client starts a thread that its ``close()`` never
  stops (PIPE-6, "no thread left").
- ``CLIENT_LOGS_KEY``: the client logs its CURVE server secret key at DEBUG;
  the engine is the reference's, which logs nothing secret (PIPE-13, "no key
  in the logs").
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from reference_impl.engine_pipeline import (
    REFERENCE_CAPABILITIES,
    HeartbeatClient,
    PipelineImplementation,
)
from reference_impl.engine_pipeline.engine import EngineCore

_log = logging.getLogger("broken_pipeline_clients")


class ThreadLeftClient(HeartbeatClient):
    """Starts a watcher thread that nothing ever stops."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        super().__init__(addresses, **options)
        self._never = threading.Event()
        threading.Thread(target=self._never.wait, name="left-behind", daemon=True).start()


class KeyLoggingClient(HeartbeatClient):
    """Logs its CURVE server secret key at DEBUG."""

    def __init__(self, addresses: Any = "tcp", **options: Any) -> None:
        super().__init__(addresses, **options)
        secret = options.get("curve_server_secret_key")
        if secret is not None:
            _log.debug("client CURVE server secret key %r", secret)


THREAD_LEFT = PipelineImplementation(engine=EngineCore, client=ThreadLeftClient,
                                     capabilities=dict(REFERENCE_CAPABILITIES))
CLIENT_LOGS_KEY = PipelineImplementation(engine=EngineCore, client=KeyLoggingClient,
                                         capabilities=dict(REFERENCE_CAPABILITIES))
