"""Raw-socket peers of the publisher under test, and the rig that drives one.

The suite plays every other party of the KV-event stream itself, with plain
pyzmq sockets, so it needs nothing of the publisher but ``publish()`` and
``shutdown()``:

- :class:`Sub`: a SUB socket subscribed to the topic, reading (or stalled);
- :class:`ReplayClient`: a DEALER that sends ``[b"", start]`` as a REQ
  socket would and reads ``[b"", seq, payload]`` answers up to the end
  marker;
- :class:`Rig`: one publisher under test on fresh ports, the model of what
  it published (seq ``i`` of this incarnation carries the ``i``-th batch that
  could be encoded), and the checks every clause test shares.

Every call into the publisher (the factory, ``publish()``, ``shutdown()``,
``stats()``) runs under :mod:`conformance.supervision.watchdog`, so a call that hangs
becomes a ``blocked`` verdict, never a hung run.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import zmq

from conformance.contracts.kv_events.spec import PublisherSpec
from conformance.supervision import watchdog
from reference_impl.kv_events.schema import (
    END_MARKER_SEQ,
    SEQ_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    SchemaError,
    decode_batch,
    encode_batch,
    first_difference,
)

__all__ = ["HOST", "Message", "ReplayClient", "Rig", "Sub", "free_ports", "make_batch"]

HOST: Final = "127.0.0.1"
#: How long the suite waits for something the publisher must do "now".
PATIENCE_S: Final = 5.0
_POLL_MS: Final = 5

#: One PUB message as received: (topic, seq frame, payload).
Message = tuple[bytes, bytes, bytes]

_stamp = itertools.count(1)


def make_batch(events: int = 1, *, tokens: int = 4) -> KVEventBatch:
    """A batch whose ``ts`` is unique in this process (so any copy of it is traceable)."""
    index = next(_stamp)
    stored = BlockStored(block_hashes=[index, index + 1], parent_block_hash=None,
                         token_ids=list(range(tokens)), block_size=max(1, tokens // 2),
                         lora_id=None, medium="GPU")
    kinds: list[Any] = [stored, BlockRemoved(block_hashes=[index], medium="GPU"),
                        AllBlocksCleared()]
    return KVEventBatch(ts=float(index), events=[kinds[i % 3] for i in range(events)])


def free_ports(count: int, *, consecutive: bool = False) -> list[int]:
    """``count`` TCP ports on :data:`HOST` that were free a moment ago (a run of
    consecutive ones if asked: data-parallel ranks derive theirs by offsets)."""
    if not consecutive:
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
        try:
            for sock in socks:
                sock.bind((HOST, 0))
            return [int(s.getsockname()[1]) for s in socks]
        finally:
            for sock in socks:
                sock.close()
    rng = random.SystemRandom()
    for _ in range(200):
        # Below the kernel's ephemeral range, where outgoing connections take ports.
        base = rng.randrange(20000, 32000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((HOST, port))
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no run of {count} free ports on {HOST}")


def tcp(port: int) -> str:
    return f"tcp://{HOST}:{port}"


class Sub:
    """A SUB socket on the publisher's endpoint; :meth:`drain` keeps what arrived."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, topic: str, *,
                 rcvhwm: int = 0, secure: Callable[[zmq.Socket[bytes]], None] | None = None
                 ) -> None:
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        if secure is not None:
            secure(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 10)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(endpoint)
        self.got: list[Message] = []
        self.malformed: list[list[bytes]] = []

    def drain(self, timeout_ms: int = 0) -> int:
        """Read what is there (waiting up to ``timeout_ms`` for the first); return the count."""
        count = 0
        if not self.sock.poll(timeout_ms):
            return 0
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return count
            count += 1
            if len(frames) == 3:
                self.got.append((frames[0], frames[1], frames[2]))
            else:
                self.malformed.append(frames)

    def close(self) -> None:
        self.sock.close(0)


class ReplayClient:
    """A DEALER on the replay endpoint speaking the REQ-shaped protocol."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, *, rcvhwm: int = 0,
                 secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> None:
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        if secure is not None:
            secure(self.sock)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames, zmq.NOBLOCK)

    def request(self, start: int) -> None:
        self.send([b"", start.to_bytes(SEQ_BYTES, "big", signed=True)])

    def read(self, *, timeout: float = PATIENCE_S, clause: str,
             pump: Callable[[], object] | None = None,
             newest: int | None = None) -> tuple[list[tuple[int, bytes]], bool]:
        """Answers up to the end marker: ``([(seq, payload), ...], ended)``.

        ``ended`` is False when no end marker came within ``timeout`` of the
        last answer. A malformed answer fails ``clause``, and so does, at once,
        an answer past ``newest`` (the newest seq published, when the caller
        knows nothing newer can be replayed): no wait for an end marker can
        make such a replay right.
        """
        answers: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pump is not None:
                pump()
            if not self.sock.poll(_POLL_MS):
                continue
            frames = self.sock.recv_multipart()
            assert len(frames) == 3 and frames[0] == b"", (
                f"{clause}: a replay answer is [b'', seq, payload]; got {len(frames)} frames "
                f"{[f[:16] for f in frames]}"
            )
            assert len(frames[1]) == SEQ_BYTES, (
                f"{clause}: replay seq frame has {len(frames[1])} bytes, not {SEQ_BYTES}"
            )
            seq = int.from_bytes(frames[1], "big", signed=True)
            if frames[1] == END_MARKER_SEQ:
                assert frames[2] == b"", f"{clause}: the end marker's payload is not empty"
                return answers, True
            assert seq >= 0, (
                f"{clause}: replay answer with seq {seq} (frame {frames[1].hex()}): the end "
                f"marker is -1 as a signed 8-byte integer ({END_MARKER_SEQ.hex()})"
            )
            if newest is not None and seq > newest:
                hint = (" (an empty payload: the end marker written unsigned? It is -1 as a "
                        f"signed 8-byte integer, {END_MARKER_SEQ.hex()})" if not frames[2] else "")
                raise AssertionError(
                    f"{clause}: replay answer with seq {seq} (frame {frames[1].hex()}) after "
                    f"{len(answers)} answers, but the newest published seq is {newest}{hint}"
                )
            answers.append((seq, frames[2]))
            deadline = time.monotonic() + timeout
        return answers, False

    def close(self) -> None:
        self.sock.close(0)


class Rig:
    """One publisher under test on fresh ports, its peers, and the model.

    ``model`` lists, per seq of the current incarnation, the batch that seq
    must carry: every batch ``publish()`` accepted that the declared encoding
    can encode. ``raised`` counts ``publish()`` calls that raised (shedding
    reported by error). A restart (:meth:`restart`) starts a new incarnation
    whose seqs count from 0 again.
    """

    def __init__(self, spec: PublisherSpec, *, clause: str, topic: str = "kv",
                 **overrides: Any) -> None:
        self.spec = spec
        self.clause = clause
        self.topic = topic
        self.overrides = overrides
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.model: list[KVEventBatch] = []
        self.unencodable = 0
        self.raised = 0
        self.peers: list[Sub | ReplayClient] = []
        self.publisher: Any = None
        #: Time ``publish()`` has cost its caller so far (see :meth:`_caller_time`).
        self.publish_seconds = 0.0
        self.incarnation = 0
        self._encodable_cache: dict[int, tuple[KVEventBatch, bool]] = {}
        try:
            self._start()
        except BaseException:
            self.ctx.destroy(0)
            raise

    # -- the publisher -------------------------------------------------------------

    def _start(self) -> None:
        last: Exception | None = None
        for _ in range(5):
            if self.incarnation == 0 or last is not None:
                pub_port, replay_port = free_ports(2)
                self.endpoint, self.replay_endpoint = tcp(pub_port), tcp(replay_port)
            try:
                self.publisher = watchdog.call(
                    "publisher factory", self.spec.build, self.endpoint, self.replay_endpoint,
                    topic=self.topic, **self.overrides,
                )
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise
                last = exc
        raise AssertionError(f"{self.clause}: no free ports for the publisher: {last}")

    def publish(self, batch: KVEventBatch, *, track: bool = True) -> bool:
        """``publish()`` under the watchdog; False if it raised (reported shedding).

        ``track=False`` leaves the batch out of the model (a test that expects
        shedding, where seqs cannot be matched to batches, counts by itself).
        """
        started = time.perf_counter()
        try:
            watchdog.call("publish()", self.publisher.publish, batch)
        except AssertionError:
            raise
        except Exception:
            self.raised += 1
            return False
        finally:
            self.publish_seconds += self._caller_time(time.perf_counter() - started)
        if not track:
            return True
        if not self._encodable(batch):
            self.unencodable += 1
            return True
        self.model.append(batch)
        return True

    def _caller_time(self, wall: float) -> float:
        """What the last ``publish()`` cost its caller: the implementation's own time where
        a driver measured it around the call (``last_call_seconds``, see
        :mod:`conformance.drivers`), else the wall time of the call here."""
        measured = getattr(self.publisher, "last_call_seconds", None)
        return float(measured) if isinstance(measured, float) else wall

    def _encodable(self, batch: KVEventBatch) -> bool:
        known = self._encodable_cache.get(id(batch))
        if known is not None and known[0] is batch:
            return known[1]
        try:
            encode_batch(batch, self.spec.encoding)  # type: ignore[arg-type]
            ok = True
        except (TypeError, ValueError, OverflowError):
            ok = False
        self._encodable_cache[id(batch)] = (batch, ok)
        return ok

    def stats(self) -> Mapping[str, int]:
        """The publisher's ``stats()`` if it has one (shedding reported by counter)."""
        stats = getattr(self.publisher, "stats", None)
        if not callable(stats):
            return {}
        got = watchdog.call("stats()", stats)
        return got if isinstance(got, Mapping) else {}

    def shutdown(self, limit: float | None = None) -> float:
        """``shutdown()`` under the watchdog; return how long it took."""
        started = time.monotonic()
        with watchdog.guard("shutdown()", limit):
            self.publisher.shutdown()
        return time.monotonic() - started

    def restart(self) -> None:
        """Shut the publisher down and start a new one on the same endpoints."""
        self.shutdown()
        self.incarnation += 1
        self.model = []
        self._start()

    # -- peers ------------------------------------------------------------------------

    def sub(self, *, rcvhwm: int = 0,
            secure: Callable[[zmq.Socket[bytes]], None] | None = None) -> Sub:
        sub = Sub(self.ctx, self.endpoint, self.topic, rcvhwm=rcvhwm, secure=secure)
        self.peers.append(sub)
        return sub

    def replay_client(self, *, rcvhwm: int = 0,
                      secure: Callable[[zmq.Socket[bytes]], None] | None = None
                      ) -> ReplayClient:
        client = ReplayClient(self.ctx, self.replay_endpoint, rcvhwm=rcvhwm, secure=secure)
        self.peers.append(client)
        return client

    def drop(self, peer: Sub | ReplayClient) -> None:
        peer.close()
        with contextlib.suppress(ValueError):
            self.peers.remove(peer)

    def join(self, sub: Sub, *, timeout: float = PATIENCE_S) -> None:
        """Publish warm-up batches until ``sub`` receives one (its subscription is in
        place: a PUB socket drops what it sends before that, by design)."""
        deadline = time.monotonic() + timeout
        have = len(sub.got)
        while len(sub.got) == have:
            assert time.monotonic() < deadline, (
                f"{self.clause}: a subscriber received nothing of {len(self.model)} batches "
                f"published in {timeout:.0f} s"
            )
            self.publish(make_batch())
            sub.drain(20)

    def wait_for(self, sub: Sub, seq: int, *, timeout: float = PATIENCE_S,
                 pump: Callable[[], object] | None = None) -> None:
        """Read ``sub`` until it has a message with seq >= ``seq``."""
        deadline = time.monotonic() + timeout
        while not sub.got or _seq(sub.got[-1][1]) < seq:
            if time.monotonic() >= deadline:
                last = _seq(sub.got[-1][1]) if sub.got else None
                raise AssertionError(
                    f"{self.clause}: seq {seq} never arrived within {timeout:.0f} s "
                    f"(last seq received: {last}; {len(self.model)} batches published)"
                )
            if pump is not None:
                pump()
            sub.drain(_POLL_MS)

    def wait_all(self, sub: Sub, **kwargs: Any) -> None:
        """Read ``sub`` until the last batch of the model arrived."""
        self.wait_for(sub, len(self.model) - 1, **kwargs)

    # -- checks -------------------------------------------------------------------

    def check_message(self, message: Message) -> int:
        """Framing, seq and payload of one PUB message against the model; return its seq."""
        topic, seq_frame, payload = message
        clause = self.clause
        assert topic == self.topic.encode(), (
            f"{clause}: topic frame {topic!r}, expected {self.topic.encode()!r}"
        )
        assert len(seq_frame) == SEQ_BYTES, (
            f"EVT-1: seq frame has {len(seq_frame)} bytes, not {SEQ_BYTES} big-endian"
        )
        seq = _seq(seq_frame)
        assert 0 <= seq < len(self.model), (
            f"EVT-1: seq {seq} but only {len(self.model)} batches were published "
            f"(seqs 0..{len(self.model) - 1})"
        )
        try:
            batch = decode_batch(payload, self.spec.encoding)  # type: ignore[arg-type]
        except SchemaError as exc:
            raise AssertionError(f"EVT-1: seq {seq}: payload does not decode: {exc}") from None
        diff = first_difference(self.model[seq], batch)
        if diff is not None:
            which = _find(self.model, batch)
            hint = f" (it is the batch published as #{which})" if which is not None else ""
            raise AssertionError(
                f"EVT-1: seq {seq} does not carry the {_ordinal(seq)} published batch: "
                f"{diff}{hint}"
            )
        return seq

    def check_stream(self, sub: Sub, *, clause: str, contiguous: bool = True) -> list[int]:
        """Every message ``sub`` got is well-formed and carries its seq's batch; seqs
        increase (by exactly one when ``contiguous``). Return the seqs."""
        assert not sub.malformed, (
            f"EVT-1: PUB message with {len(sub.malformed[0])} frames, not 3 "
            f"[topic, seq, payload]"
        )
        seqs = [self.check_message(m) for m in sub.got]
        for before, after in itertools.pairwise(seqs):
            if after == before:
                raise AssertionError(f"{clause}: seq {after} delivered twice")
            if after < before:
                raise AssertionError(f"{clause}: seq {after} after seq {before}: reordered")
            if contiguous and after != before + 1:
                raise AssertionError(
                    f"{clause}: gap: seq {before} then {after} to a reading subscriber"
                )
        return seqs

    def close(self) -> None:
        for peer in list(self.peers):
            peer.close()
        self.peers.clear()
        if self.publisher is not None:
            with contextlib.suppress(Exception):
                watchdog.call("shutdown()", self.publisher.shutdown)
        self.ctx.destroy(0)

    def __enter__(self) -> Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


def _find(model: list[KVEventBatch], batch: KVEventBatch) -> int | None:
    for index, candidate in enumerate(model):
        if candidate.ts == batch.ts:
            return index
    return None


def _ordinal(n: int) -> str:
    return f"#{n}"
