"""The deterministic fake engine core the engine-pipeline suite drives every engine with.

An engine under test is given a :class:`FakeModel` instead of a GPU model.
It is the same function everywhere (the suite predicts every token), cheap
(a CRC per token), and it can misbehave on request: stall each step, raise
(a fatal step error), hang, or end its process.

Contract (what an engine may rely on)
    ``add(request)`` takes an :class:`~reference_impl.engine_pipeline.wire.AddRequest`;
    ``abort(ids)`` stops the named requests; ``step()`` returns
    ``[(client_index, EngineOutput)]`` with one token per running request
    (:func:`token_of` of the request id and position), the request's payload
    echoed on its first output, and ``finish_reason`` LENGTH on its last;
    aborted requests get one ABORT finish with no tokens on the next step;
    ``utility(name, args)`` runs one of :data:`UTILITIES`. ``has_work``
    tells whether ``step()`` has anything to do. Calls come from one thread.

Engine-originated endings (PIPE-8): a prompt whose first token is
:data:`REJECT_TOKEN` is rejected (one ERROR finish, no tokens); a prompt
``[ENGINE_ABORT_TOKEN, k]`` is aborted by the engine after ``k`` tokens.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from reference_impl.engine_pipeline.wire import (
    AddRequest,
    EngineOutput,
    FinishReason,
    prepare,
)

__all__ = [
    "ENGINE_ABORT_TOKEN",
    "REJECT_TOKEN",
    "UTILITIES",
    "VOCAB",
    "FakeModel",
    "ModelFailure",
    "detail_of",
    "token_of",
]

#: Token ids are in ``range(VOCAB)``.
VOCAB: Final = 151_936
REJECT_TOKEN: Final = -1
ENGINE_ABORT_TOKEN: Final = -2
UTILITIES: Final = ("echo", "fail", "sleep", "pid", "step_count", "running")
_LENGTH: Final = int(FinishReason.LENGTH)
_ABORT: Final = int(FinishReason.ABORT)


class ModelFailure(RuntimeError):
    """The fake model failing on purpose (a fatal step error, a raising utility)."""


def token_of(request_id: str, position: int) -> int:
    """The token a request produces at ``position`` (0-based), everywhere the same."""
    return zlib.crc32(f"{request_id}/{position}".encode()) % VOCAB


def detail_of(request_id: str, position: int, size: int) -> bytes:
    """``size`` deterministic bytes for one output (the suite's zero-copy check, PIPE-3)."""
    seed = hashlib.blake2b(f"{request_id}/{position}".encode(), digest_size=64).digest()
    return (seed * (size // len(seed) + 1))[:size]


@dataclass(slots=True)
class _Running:
    request: AddRequest
    produced: int = 0
    abort_after: int | None = None


@dataclass
class FakeModel:
    """The suite's engine core (see the module docstring).

    Behaviour switches (all off by default):
        stall_ms: sleep this long in every ``step()`` (a slow model).
        raise_at_step: ``step()`` number N (1-based) raises :class:`ModelFailure`.
        hang_at_step: ``step()`` number N blocks forever.
        exit_at_step: ``step()`` number N ends the process with exit status 0.
        detail_bytes: every output carries ``detail_of(rid, pos, n)`` (n bytes).
    """

    stall_ms: float = 0.0
    raise_at_step: int | None = None
    hang_at_step: int | None = None
    exit_at_step: int | None = None
    detail_bytes: int = 0
    steps: int = 0
    _running: dict[str, _Running] = field(default_factory=dict)
    _endings: list[tuple[int, EngineOutput]] = field(default_factory=list)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> FakeModel:
        """A model from a plain mapping (how the suite passes it to an engine process)."""
        known = {"stall_ms", "raise_at_step", "hang_at_step", "exit_at_step", "detail_bytes"}
        values = dict(options or {})
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown fake-model option {unknown[0]!r}; known: "
                             f"{', '.join(sorted(known))}")
        return cls(**values)

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._endings)

    def add(self, request: AddRequest) -> None:
        prompt = request.prompt_token_ids
        rid = request.request_id
        if (prompt and prompt[0] == REJECT_TOKEN) or request.max_tokens < 1 \
                or rid in self._running:
            self._endings.append((request.client_index, EngineOutput(
                rid, [], int(FinishReason.ERROR))))
            return
        running = _Running(request)
        if len(prompt) >= 2 and prompt[0] == ENGINE_ABORT_TOKEN:
            running.abort_after = max(0, prompt[1])
        self._running[rid] = running

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            running = self._running.pop(rid, None)
            if running is not None:
                self._endings.append((running.request.client_index, EngineOutput(
                    rid, [], int(FinishReason.ABORT))))

    def step(self) -> list[tuple[int, EngineOutput]]:
        self.steps += 1
        if self.stall_ms:
            time.sleep(self.stall_ms / 1000)
        if self.steps == self.raise_at_step:
            raise ModelFailure(f"the fake model's step {self.steps} failed on purpose")
        if self.steps == self.hang_at_step:
            threading.Event().wait()
        if self.steps == self.exit_at_step:
            os._exit(0)
        out, self._endings = self._endings, []
        ended: list[str] = []  # removed after the loop: no copy of the running table per step
        for rid, running in self._running.items():
            req = running.request
            position = running.produced
            if running.abort_after is not None and position >= running.abort_after:
                ended.append(rid)
                out.append((req.client_index, EngineOutput(rid, [], _ABORT)))
                continue
            running.produced = position + 1
            last = position + 1 >= req.max_tokens
            detail: Any = None
            if self.detail_bytes:
                detail = prepare(detail_of(rid, position, self.detail_bytes))
            payload = prepare(req.payload) if position == 0 and req.payload is not None else None
            out.append((req.client_index, EngineOutput(
                rid, [token_of(rid, position)], _LENGTH if last else None, payload, detail)))
            if last:
                ended.append(rid)
        for rid in ended:
            del self._running[rid]
        return out

    def utility(self, name: str, args: list[Any]) -> Any:
        if name == "echo":
            return prepare(args)
        if name == "fail":
            raise ModelFailure(f"the fake model's utility 'fail' raised on purpose: {args!r:.60}")
        if name == "sleep":
            time.sleep(float(args[0]) / 1000 if args else 0.0)
            return args[0] if args else 0
        if name == "pid":
            return os.getpid()
        if name == "step_count":
            return self.steps
        if name == "running":
            return sorted(self._running)
        raise ModelFailure(f"unknown utility {name!r}; the fake model has "
                           f"{', '.join(UTILITIES)}")


