"""The ``engine-pipeline`` contract: API server <-> EngineCore over ZeroMQ (PIPE-1..14).

Clause texts are in :mod:`.clauses`, the registry entry in :mod:`.contract`;
the implementation under test and its capabilities in :mod:`.spec`; engine
processes, guarded clients and stream checks in :mod:`.harness` (engines run
in :mod:`.engine_host`); the raw ``vllm-v1`` peers that let the suite play
either side in :mod:`.peers`; the tests in ``suite/`` and ``chaos_suite/``; the mutants that prove
each clause's tests can fail in :mod:`.mutants`. The profile is
``reference_impl.engine_pipeline.wire``; the contract is described in
``docs/engine_pipeline.md``.
"""
