"""Self-check: does the suite catch known-broken transports?

:mod:`conformance.selfcheck.mutants` loads the catalogs (and defines the
extension point, :class:`Mutant`); each contract's built-in catalog is in its
family package (``conformance.contracts.p2p.mutants``, ...);
:mod:`conformance.selfcheck.runner` is the ``zmq-conformance self-check``
command. Nothing here is imported by the plugin or the suite.
"""

from conformance.selfcheck.mutants import Mutant

__all__ = ["Mutant"]
