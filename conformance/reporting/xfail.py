"""The expected-failure file: clauses or tests a transport is known to break.

Format (UTF-8 text, one entry per line)::

    # comments and blank lines are ignored
    CONN-3: reconnect in the dead window not supported yet (issue #12)
    test_messages.py::test_size_limit: our limit is not configurable
    test_flapping

An entry is a clause ID (``CONN-3``) or a substring of test node IDs
(``test_messages.py::test_size_limit``, or just a test name). The reason
follows the first ``": "`` (colon and space); without one the reason is
``"listed in the xfail file"``. A clause entry marks every test that checks
that clause; a test entry marks every test whose node ID contains it.

Marked tests run as strict expected failures: a failure is reported
``xfailed``; a pass is ``xpassed`` and fails the run (the list is out of date
and should shrink). Entries that match no collected test produce a warning.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.contracts import CLAUSES
from conformance.errors import ConfigError

DEFAULT_REASON = "listed in the xfail file"
_CLAUSE_ID = re.compile(r"^[A-Z][A-Z0-9]*-\d+$")


@dataclass(frozen=True)
class XfailEntry:
    """One line of the file: what it matches, why, and where it was written."""

    pattern: str
    reason: str
    line: int

    @property
    def is_clause(self) -> bool:
        return bool(_CLAUSE_ID.match(self.pattern))

    def matches(self, nodeid: str, clauses: Iterable[str]) -> bool:
        if self.is_clause:
            return self.pattern in clauses
        return self.pattern in nodeid

    def describe(self, origin: str) -> str:
        return f"{origin}:{self.line}: {self.pattern!r}"


def parse(text: str, *, origin: str = "xfail file") -> list[XfailEntry]:
    """Parse the file's text; an empty pattern is a :class:`ConfigError` naming the line."""
    entries: list[XfailEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = line.partition(": ")
        pattern = pattern.strip()
        if not sep and pattern.endswith(":") and not pattern.endswith("::"):
            pattern = pattern[:-1].strip()
        if not pattern:
            raise ConfigError(
                f"{origin}:{number}: an entry needs a clause ID or test ID before ':'"
            )
        entries.append(XfailEntry(pattern, reason.strip() or DEFAULT_REASON, number))
    return entries


def load(path: str | Path, *, option: str = "--zmq-xfail-file") -> list[XfailEntry]:
    """Read and parse the file at ``path``; unreadable files are a :class:`ConfigError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{option}={str(path)!r}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{option}={str(path)!r}: not UTF-8 text") from None
    return parse(text, origin=str(path))


def unknown_clauses(entries: Sequence[XfailEntry]) -> list[XfailEntry]:
    """Entries shaped like a clause ID that the registry does not know."""
    return [e for e in entries if e.is_clause and e.pattern not in CLAUSES]


def match(
    entries: Sequence[XfailEntry], tests: Iterable[tuple[str, Sequence[str]]]
) -> tuple[dict[str, str], list[XfailEntry]]:
    """Match entries against ``(nodeid, clause IDs)`` pairs.

    Returns the reason per matched node ID (several matching entries join
    their reasons with ``"; "``) and the entries that matched nothing.
    """
    reasons: dict[str, list[str]] = {}
    used: set[int] = set()
    for nodeid, clauses in tests:
        for index, entry in enumerate(entries):
            if entry.matches(nodeid, clauses):
                used.add(index)
                bucket = reasons.setdefault(nodeid, [])
                if entry.reason not in bucket:
                    bucket.append(entry.reason)
    unmatched = [e for i, e in enumerate(entries) if i not in used]
    return {k: "; ".join(v) for k, v in reasons.items()}, unmatched


class ZmqConformanceWarning(pytest.PytestWarning):
    """A configuration smell that does not stop the run (e.g. an unmatched xfail entry)."""


#: The reason of a test the xfail file expects to fail (set at collection).
XFAIL_KEY = pytest.StashKey[str]()


def apply(
    config: pytest.Config, entries: Sequence[XfailEntry], origin: str,
    tagged: Sequence[tuple[pytest.Item, tuple[str, ...]]],
) -> list[str] | None:
    """Mark the tests ``entries`` (read from ``origin``) expect to fail (strict xfail);
    warn once per run about each entry that matches nothing, and return those warnings
    (``None`` without entries)."""
    if not entries:
        return None
    reasons, unmatched = match(entries, [(item.nodeid, ids) for item, ids in tagged])
    for item, _ in tagged:
        reason = reasons.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
            item.stash[XFAIL_KEY] = reason
            item.user_properties.append(("zmq_xfail", reason))
    messages: list[str] = []
    for entry in unmatched:
        what = "unknown clause" if unknown_clauses([entry]) else "no test"
        messages.append(
            f"{entry.describe(origin)} matches {what}; remove or fix the entry"
        )
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        # xdist: the controller collects nothing; it learns these at pytest_testnodedown.
        config.workeroutput["zmq_conformance_warnings"] = messages  # type: ignore[attr-defined]
        if worker.get("workerid") != "gw0":
            return messages  # one warning per run, not one per worker
    for entry, message in zip(unmatched, messages, strict=True):
        warnings.warn_explicit(
            ZmqConformanceWarning(message), ZmqConformanceWarning,
            origin, entry.line,
        )
    return messages
