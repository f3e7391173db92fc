"""Chaos clauses of the control channel: partitions, latency, resets and restarts behind a proxy."""
