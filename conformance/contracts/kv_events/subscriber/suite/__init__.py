"""Property tests of the ``kv-events-subscriber`` contract, one module per concern."""
