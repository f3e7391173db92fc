"""SEC-1's flooding peer is its own process: it floods, counts, stops, and leaves nothing.

A flooding thread in the test process held the GIL that an in-process
implementation's ``poll()`` needs (see docs/load-verdicts.md); these check the
process that replaced it.
"""

from __future__ import annotations

import os
import threading
import time

from conformance.contracts.p2p.hostile import Flooder, RawRouter


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_flood_comes_from_another_process_and_ends_with_it() -> None:
    threads = threading.active_count()
    with RawRouter() as router:
        with Flooder(router.address, [b"flood"], identity=b"127.0.0.1:9",
                     max_messages=300) as flood:
            assert flood._proc is not None
            pid = flood._proc.pid
            assert pid != os.getpid()
            assert threading.active_count() == threads, "the flood runs a thread in the test"
            frames = router.recv(timeout=10.0)
            assert frames == [b"127.0.0.1:9", b"flood"], frames
            deadline = time.monotonic() + 30
            while flood.sent < 300 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert flood.sent == 300
        assert flood.sent == 300, "the count is kept after the flood"
    assert _gone(pid), "the flooding process outlived its flood"
