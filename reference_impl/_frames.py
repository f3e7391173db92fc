"""Multipart send and receive for the references' hot paths, at the cost of the frames alone.

pyzmq's ``Socket.send_multipart`` checks every frame for the buffer
interface and computes ``zmq.SNDMORE | flags`` on ``IntFlag`` enums once per
frame, and its ``Socket.send`` / ``recv`` / ``getsockopt`` wrappers add
keyword handling (``routing_id``, ``group``, copy thresholds) that a copying
send of ``bytes`` never uses. For the references' small multipart messages
(a ROUTER's identity, a request id, an empty delimiter, a payload) that
Python work costs several times the sends themselves; measured here on
pyzmq 27 / Python 3.11, ``send_multipart`` of three small frames took about
19 us against 2-3 us for the three backend sends.

:func:`send_frames` and :func:`recv_frames` make exactly the libzmq calls
those methods make, in the same order, through the Cython backend class
``zmq.backend.Socket`` that ``zmq.Socket`` derives from, with plain-int
flags. Why that is safe:

- Same semantics: a multipart message is still sent one frame at a time
  with ``ZMQ_SNDMORE`` on all but the last, and received one frame at a
  time while ``ZMQ_RCVMORE`` is set. libzmq applies the high-water mark to a
  message's first frame only, so with ``NOBLOCK`` either the first send
  raises ``zmq.Again`` and nothing was queued, or the whole message is
  queued (as with ``send_multipart``).
- Same copies: ``bytes`` frames, ``copy=True``. The only checks skipped are
  the buffer-interface ones, and every caller passes ``bytes`` it built.
- Errors are unchanged: the backend raises the same ``zmq.ZMQError``
  subclasses (``zmq.Again``, ``ContextTerminated``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import zmq
from zmq.backend import Socket as _BackendSocket

_backend_send = _BackendSocket.send
_backend_recv = _BackendSocket.recv
_backend_get = _BackendSocket.get
# Plain ints: pyzmq's IntFlag arithmetic costs microseconds per call.
_SNDMORE, _EVENTS, _POLLIN = int(zmq.SNDMORE), int(zmq.EVENTS), int(zmq.POLLIN)


def send_frames(sock: zmq.Socket[bytes], frames: Sequence[bytes], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags)`` for ``bytes`` frames (``flags`` a plain int)."""
    more = flags | _SNDMORE
    for frame in frames[:-1]:
        _backend_send(sock, frame, more)
    _backend_send(sock, frames[-1], flags)


def recv_frames(sock: zmq.Socket[bytes], flags: int = 0) -> list[bytes]:
    """``sock.recv_multipart(flags)``: one whole message as ``bytes`` frames.

    Each frame is received as a ``zmq.Frame`` and copied out with ``.bytes``
    (what a copying receive does inside), because the frame carries its own
    ``ZMQ_RCVMORE`` bit: asking the socket instead costs a ``getsockopt``
    that pyzmq routes through a ``SocketOption`` enum lookup, per frame.
    """
    frame = _backend_recv(sock, flags, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _backend_recv(sock, flags, False)
        frames.append(frame.bytes)
    return frames


def readable(sock: zmq.Socket[bytes]) -> bool:
    """A whole message is waiting (``ZMQ_EVENTS``; no exception when there is none)."""
    return bool(cast(int, _backend_get(sock, _EVENTS)) & _POLLIN)
