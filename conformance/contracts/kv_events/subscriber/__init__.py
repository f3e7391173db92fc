"""The ``kv-events-subscriber`` contract: the consumer of a KV-event stream is under test.

The suite plays the publisher with raw sockets (:mod:`.peer`): a correct
one, and one that garbles, restarts, answers replays partially, late or not
at all. Clause texts are in :mod:`.clauses`, the tests in ``suite/``, the
mutants that prove each clause's test can fail in :mod:`.mutants`.
"""
