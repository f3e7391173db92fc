"""The KV-cache event stream: its public wire schema and reference implementations.

:mod:`reference_impl.kv_events.schema` is the wire format (structs, encodings,
frames); :mod:`reference_impl.kv_events.publisher` and
:mod:`reference_impl.kv_events.subscriber` are the references that pass the
``kv-events-publisher`` and ``kv-events-subscriber`` contracts.
"""

from reference_impl.kv_events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch"]
