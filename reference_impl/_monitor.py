"""Reading libzmq socket monitor events, shared by the reference transports."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

__all__ = ["monitor_event"]

#: A monitor event's first frame: the event (16 bits) and a value (32 bits), native order.
_FRAME: Final = struct.Struct("=Hi")


def monitor_event(frames: Sequence[bytes]) -> int:
    """The event of a libzmq monitor message (a ``zmq.EVENT_*`` value).

    The first frame holds the event and a value, the second names the
    endpoint. Read here rather than with ``zmq.utils.monitor``, whose import
    brings in asyncio: about 70 ms of CPU in every process that loads a
    transport.
    """
    if len(frames) != 2 or len(frames[0]) != _FRAME.size:
        raise ValueError(f"not a monitor event: {len(frames)} frame(s)")
    return int(_FRAME.unpack(frames[0])[0])
