"""Benchmarks: the reference transport, the suite and the fault proxy, measured.

Run ``python -m benchmarks`` (or ``tox -e bench``). Nothing here is imported
by the package or the tests; the numbers are for the README and for users
choosing a transport or a gate.
"""
