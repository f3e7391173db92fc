"""The conformance suite: one or more tests per contract clause.

Every test is marked ``@pytest.mark.clause("ID", ...)`` with the IDs of
:mod:`conformance.contracts.p2p.clauses` it checks, and receives the
transport under test through the ``zmq_transport_spec`` fixture of the
plugin. Tests build fresh nodes on fresh ports for every Hypothesis example
(:class:`conformance.contracts.p2p.harness.Cluster`),
reach the transport only through the duck-typed interface of ``DESIGN.md``,
and synchronise by driving ``poll()`` until a condition holds, never by
sleeping. Every call into the implementation runs under a watchdog
(:mod:`conformance.supervision.watchdog`): a call that hangs becomes a ``blocked``
verdict, not a hung run.

Modules, by clause family:

- ``test_connections``: CONN-1 .. CONN-7 (including reconnects in the
  dead-but-registered window and flapping without a pause);
- ``test_polling``: POLL-1, POLL-2, POLL-4, POLL-5;
- ``test_messages``: MSG-1 .. MSG-5;
- ``test_resources``: RES-1, RES-2 (descriptor and thread counts);
- ``test_security``: POLL-3, SEC-1, SEC-2 (hostile peers and floods).

Depth follows the active profile (``--zmq-profile``): Hypothesis example
counts through :func:`conformance.config.profiles.suite_settings`, loop counts of
example tests through :func:`conformance.config.profiles.scaled`. A clause that
needs a capability the transport does not declare is skipped with the reason
and the way to declare it.
"""
