"""Property tests of the ``kv-events-publisher`` contract (EVT-1 .. EVT-9).

Every test receives the publisher under test through ``kv_publisher_spec``
(``conftest.py``), plays its peers with raw sockets
(:mod:`conformance.contracts.kv_events.publisher.peers`) and calls the
publisher only under the watchdog.
"""
