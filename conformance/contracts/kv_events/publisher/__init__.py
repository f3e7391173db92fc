"""The ``kv-events-publisher`` contract: the publisher of a KV-event stream is under test.

The suite plays subscribers (SUB), replay clients (DEALER, also hostile ones)
with raw sockets (:mod:`.peers`) and checks what arrives against a model of
the sequence per publisher incarnation. Clause texts are in :mod:`.clauses`,
the tests in ``suite/`` (:mod:`.machine` is the stateful machine), the
mutants that prove each clause's test can fail in :mod:`.mutants`.
"""
