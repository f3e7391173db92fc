"""The chaos clauses (HB-1..HB-7) and the chaos state machine.

Collected by the plugin only with ``--zmq-chaos`` (the CLI's ``--chaos``);
every test carries ``@pytest.mark.chaos`` and the clause it checks. The tests
need the ``toxiproxy`` fixture of :mod:`chaos.fixtures` and the plugin's
``zmq_transport_spec``. See ``docs/chaos.md``.
"""
