"""Self-check: does the suite catch known-broken transports?

:mod:`conformance.selfcheck.mutants` is the catalog (and the extension point,
:class:`Mutant`), :mod:`conformance.selfcheck.transports` the built-in mutant
transports, :mod:`conformance.selfcheck.runner` the ``zmq-conformance
self-check`` command. Nothing here is imported by the plugin or the suite.
"""

from conformance.selfcheck.mutants import CATALOG, Mutant

__all__ = ["CATALOG", "Mutant"]
