"""The KV-cache event stream: ``kv-events-publisher`` and ``kv-events-subscriber``.

An engine publishes KV-cache lifecycle events (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``) in batches on a PUB socket, numbered
from 0, and answers replay requests on a ROUTER; KV-aware routers consume
them (DESIGN.md, "KV-event stream"). Two contracts, one package each:

- :mod:`.publisher`: the publisher is under test (EVT-1..9); the suite plays
  subscribers and replay clients with raw sockets;
- :mod:`.subscriber`: the consumer is under test (EVS-1..9); the suite plays
  a publisher, also a hostile or restarting one.

:mod:`.contract` holds both contracts' registry entries; :mod:`.spec` pairs
a factory with the capabilities it declares (the wire profile among them:
:mod:`reference_impl.kv_events.wire`). The public
wire schema and the reference implementations are in
:mod:`reference_impl.kv_events`.
"""
