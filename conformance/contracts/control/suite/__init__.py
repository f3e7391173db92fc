"""The control-channel suite: CTL-1..3 and CTL-7 on the server (raw wire peers), CTL-4..6 on
the client, and the state machine. The chaos clauses are in ``../chaos_suite``."""
