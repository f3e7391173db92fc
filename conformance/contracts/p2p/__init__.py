"""The ``p2p`` contract: the peer-to-peer control transport.

A node binds one ROUTER and opens a DEALER per peer; the caller drives all I/O
through ``poll()`` (DESIGN.md, "The interface under test"). The family's
parts:

- :mod:`.clauses`: the clause texts (CONN, POLL, MSG, HB, PROC, RES, SEC);
- :mod:`.contract`: the registry entry (where the parts below live);
- ``suite/``: the property tests, one module per clause family, and the
  stateful machine test; ``chaos_suite/``: the heartbeat clauses under
  injected faults and the chaos machine test (collected with ``--chaos``);
- :mod:`.machines`: the stateful cluster machine and its model;
  :mod:`.chaos_machine` its fault-injecting subclass;
- :mod:`.mutants`: the self-check catalog; :mod:`.transports` its mutant
  transports (each the reference with one real-world defect).

The reference implementation is ``reference_impl:ZmqTransport``.
"""
