"""A kv-events-publisher driver that knows only the first text of protocol 1.

It offers ``publisher``, ``publish``, ``shutdown`` and ``stats``, and answers
every other call (``publish_many``, ``publish_copies``: later additions) with
``unsupported``, as a driver written before them does. The implementation is
the reference publisher, in this process. Written against docs/drivers.md
only: the framing is done by hand.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from reference_impl.kv_events.publisher import KVEventPublisher, PublisherClosedError
from reference_impl.kv_events.schema import KVEventBatch

OUT = sys.stdout.buffer
sys.stdout = sys.stderr  # the protocol only on the real stdout


def read() -> dict[str, Any] | None:
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        return None
    body: dict[str, Any] = msgspec.msgpack.decode(
        sys.stdin.buffer.read(int.from_bytes(header, "big")))
    return body


def write(body: dict[str, Any]) -> None:
    payload = msgspec.msgpack.encode(body)
    OUT.write(len(payload).to_bytes(4, "big") + payload)
    OUT.flush()


def answer(publisher: KVEventPublisher | None, request: dict[str, Any]) -> dict[str, Any]:
    call, args = request["call"], request.get("args") or {}
    if call == "publish" and publisher is not None:
        try:
            publisher.publish(msgspec.convert(args["batch"], KVEventBatch))
        except PublisherClosedError as exc:
            return {"error": {"kind": "closed", "message": str(exc)}}
        return {"result": None}
    if call == "shutdown" and publisher is not None:
        publisher.shutdown()
        return {"result": None}
    if call == "stats" and publisher is not None:
        return {"result": publisher.stats()}
    return {"error": {"kind": "unsupported", "message": f"no call {call!r} in this driver"}}


def main() -> None:
    hello = read()
    assert hello is not None
    write({"type": "hello", "protocol": 1, "contract": hello["contract"],
           "implementation": "protocol-1 publisher (tests)", "options": ["max_queue"]})
    publisher: KVEventPublisher | None = None
    while (request := read()) is not None:
        if request["call"] == "publisher":
            args = request["args"]
            publisher = KVEventPublisher(args.pop("endpoint"), args.pop("replay_endpoint"),
                                         **args)
            reply: dict[str, Any] = {"result": {"handle": 1}}
        else:
            reply = answer(publisher, request)
        write({"id": request["id"], **reply})


if __name__ == "__main__":
    main()
