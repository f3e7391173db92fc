"""The ``p2p`` reference: the peer-to-peer control transport (ROUTER in, a DEALER
per peer, ZMTP heartbeats). ``reference_impl`` re-exports it, so the default
transport stays ``reference_impl:ZmqTransport``."""
