"""The engine-pipeline clauses PIPE-1..14, by stable ID (texts follow ``DESIGN.md``).

PIPE-13 and PIPE-14 are the family's security clauses ("Security across
families"), numbered after its behavioural ones as the other families did
(p2p SEC-2/SEC-3, EVT-10/11, EVS-10/11, CTL-8/9).
"""

from __future__ import annotations

from typing import Final

from conformance.clauses import Clause

CLAUSES: Final[dict[str, Clause]] = {
    c.id: c
    for c in (
        Clause(
            "PIPE-1",
            "framing and payload fidelity; oversize refused at add()",
            "Bytes and arrays of every dtype, 0-d, empty, non-contiguous, sizes around the "
            "inline threshold and pyzmq's 64 KiB copy threshold, several per message, arrive "
            "byte-exact; aux indices in range and all used; oversize refused at add(), never "
            "truncated.",
        ),
        Clause(
            "PIPE-2",
            "per request: outputs in order, once, one finish; aborts end cleanly",
            "Per request: outputs in order, each once, one finish; an abort ends with one abort "
            "finish and nothing after; bursts and slow readers.",
        ),
        Clause(
            "PIPE-3",
            "no in-flight buffer is modified (payload frame's tracker)",
            "No in-flight buffer is modified (zero-copy reuse: the payload frame's tracker, not "
            "the last frame's; vLLM #24655, PR #50053).",
        ),
        Clause(
            "PIPE-4",
            "the engine loop never blocks on the pipeline",
            "The engine's loop never blocks on the pipeline: a client that stops reading, "
            "vanishes or floods costs the others nothing beyond a bound (vLLM #53859).",
        ),
        Clause(
            "PIPE-5",
            "engine death seen within the bound; every waiter released",
            "Engine death (SIGKILL, fatal step error, exit 0, death during startup; SIGSTOP with "
            "detects_hang) is seen within the bound; every waiter and pending utility call is "
            "released with an error; later calls raise at once; no false death (vLLM PRs "
            "#21443, #21728, #56416).",
        ),
        Clause(
            "PIPE-6",
            "bounded shutdown; nothing left; failures exit non-zero",
            "Bounded shutdown on both sides with requests in flight; no descriptor, thread, "
            "process or ipc file left; a killed client takes its engines with it (vLLM #55510); "
            "an engine failure is a non-zero exit (vLLM #48966).",
        ),
        Clause(
            "PIPE-7",
            "hostile frames: no code execution, no silent hang",
            "Hostile frames (unknown type byte, truncated or garbage MessagePack, aux index out "
            "of range, shape vs buffer, a pickle extension that would run code): never code "
            "execution, never a silent hang; the loop survives (tolerate) or the side dies "
            "visibly within the death bound (fatal), never the silent dead input thread "
            "(vLLM #26139).",
        ),
        Clause(
            "PIPE-8",
            "routing by client index with several clients and engines",
            "Routing by client index with several clients and engines, engine-originated aborts "
            "and rejections included (SGLang #33858).",
        ),
        Clause(
            "PIPE-9",
            "startup handshake: any order, bounded, strangers refused",
            "Startup handshake: any start order; ready and handshake timeouts bounded and "
            "configurable (vLLM #17676, PR #27444); unknown or duplicate engines refused; the "
            "first request after wait_ready() is answered.",
        ),
        Clause(
            "PIPE-10",
            "address hygiene: late binding, unique ipc paths, restart after SIGKILL",
            "Concurrent pipelines on one host never collide or cross-connect (late binding, "
            "vLLM #24756); ipc paths unique, within the socket path limit, never taken over "
            "from a live pipeline, removed on close; a pipeline restarts after SIGKILL "
            "(SGLang #22779).",
        ),
        Clause(
            "PIPE-11",
            "restart per the declared policy; no output of a dead incarnation",
            "Restart per the declared policy: stays dead with typed errors, or adopts a "
            "replacement; never an output of a dead incarnation.",
        ),
        Clause(
            "PIPE-12",
            "utility calls matched, failures propagated, timeouts honoured",
            "Utility calls: matched by call id, failures propagated, late replies dropped "
            "without killing the receiver, rejected during shutdown, timeouts honoured.",
        ),
        Clause(
            "PIPE-13",
            "strangers get no request and no output in; engines refuse impostor clients",
            "Where the implementation declares authentication (CURVE; the client binds, so it "
            "is the CURVE server on all three sockets, the handshake one included): an engine "
            "without an allowed key (plain, or CURVE with a key of its own) gets no WELCOME, no "
            "request, and none of its outputs or ENGINE_CORE_DEAD sentinels reach the client; "
            "an engine given the client's server key sends no HELLO to a client without the "
            "matching secret (plain, or CURVE with another key); keyed peers are unaffected; "
            "no secret key appears in logs or reprs.",
        ),
        Clause(
            "PIPE-14",
            "hostile bytes on the client's ports are harmless",
            "Raw TCP peers on the client's handshake, request and output ports sending random "
            "or truncated ZMTP greetings, NULL and CURVE handshakes with garbage commands (a "
            "CURVE HELLO with random boxes), frames announced past the receive limit, and "
            "floods from many identities neither stop the client nor starve its engines, "
            "inject nothing, and cost bounded memory (the peak RSS growth is reported).",
        ),
    )
}
