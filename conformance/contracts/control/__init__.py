"""The ``control`` contract: the worker/server control channel (CTL-1..9).

A server answers MessagePack requests ``{"type": ...}`` and a client sends
them with a periodic PING as its heartbeat (the LMCache shape). Clause texts
are in :mod:`.clauses`, the registry entry in :mod:`.contract`; the
implementation under test and its capabilities in :mod:`.spec`; the wire
profiles (``rep-envelope``, ``lmcache-mq``, ``lmcache-0.5``) in :mod:`.wire` and the check that
the server speaks the declared one, before any clause, in :mod:`.preflight`;
servers in their own thread (or on their own I/O thread), guarded clients and
raw wire peers in :mod:`.harness`; the toxiproxy rig in :mod:`.faults`; the
state machine in :mod:`.machine`; the tests in ``suite/`` and
``chaos_suite/``; the mutants that prove each clause's tests can fail in
:mod:`.mutants`. The contract itself is stated in
``reference_impl.control.interface`` and ``docs/control.md``.
"""
