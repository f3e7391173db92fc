"""What the plugin collects: the suite's directories, its modules, its clause tests.

The suite runs only when the session opted in. :func:`extend_args` then
appends the suite's directories to the collection arguments, unless the
arguments already cover them, so the suite never runs twice; with
``--zmq-conformance-only`` the arguments become the suite (or the arguments
that point into it). :func:`suite_module` collects its ``test_*.py`` whatever
the user's ``python_files``. :func:`tag_clause_tests` marks each test with the
clauses it checks, :func:`hold_back_chaos` deselects chaos tests unless
``--zmq-chaos`` is given, and :func:`longest_first` starts the long tests
(``@pytest.mark.long(seconds)``: the state machines) first, one per worker.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from pathlib import Path

import pytest

from conformance.config import selection
from conformance.contracts import CLAUSES
from conformance.errors import ConfigError

__all__ = [
    "CLAUSES_KEY", "LONG_MARKER", "extend_args", "hold_back_chaos", "longest_first",
    "suite_module", "tag_clause_tests",
]

#: The marker of a long test and its typical run time: ``@pytest.mark.long(15)``.
LONG_MARKER = "long"

#: A clause test's clause IDs (set at collection).
CLAUSES_KEY = pytest.StashKey[tuple[str, ...]]()


def extend_args(config: pytest.Config, *, only: bool, suite_dirs: Sequence[Path]) -> None:
    """Point the collection at the suite (see the module docstring for the rules)."""
    invocation = config.invocation_params.dir
    explicit = config.args_source == pytest.Config.ArgsSource.ARGS
    args = list(config.args)
    inside = [a for a in args if _arg_inside(invocation, a, suite_dirs)]
    if only:
        config.args[:] = inside if (explicit and inside) else _suite_args(suite_dirs)
        return
    if inside or any(_arg_covers(invocation, a, suite_dirs) for a in args):
        return
    config.args.extend(_suite_args(suite_dirs))


def _arg_path(invocation: Path, arg: str) -> Path:
    return (invocation / arg.split("::", 1)[0]).resolve()


def _arg_inside(invocation: Path, arg: str, dirs: Sequence[Path]) -> bool:
    path = _arg_path(invocation, arg)
    return any(path == d or path.is_relative_to(d) for d in dirs)


def _arg_covers(invocation: Path, arg: str, dirs: Sequence[Path]) -> bool:
    """True when pytest's own recursion from ``arg`` would reach a suite directory.

    Recursion stops at hidden directories, virtualenvs and ``site-packages``,
    so an installed suite is never "covered" by a project's ``.``.
    """
    path = _arg_path(invocation, arg)
    for suite_dir in dirs:
        if not suite_dir.is_relative_to(path) or suite_dir == path:
            continue
        between = suite_dir.relative_to(path).parts
        probe = path
        blocked = False
        for part in between:
            probe = probe / part
            if part.startswith(".") or part == "site-packages" or (probe / "pyvenv.cfg").exists():
                blocked = True
                break
        if not blocked:
            return True
    return False


def _suite_args(dirs: Sequence[Path]) -> list[str]:
    """The collection arguments for the suite: its directories.

    Directories, not files: pytest names tests outside the rootdir relative
    to the argument, so files would lose their module in the node ID.
    """
    return [str(d) for d in dirs]


def suite_module(
    file_path: Path, parent: pytest.Collector, suite_dirs: Sequence[Path]
) -> pytest.Module | None:
    """The suite's ``test_*.py`` as a module, even where the user's ``python_files``
    would not collect it (``None``: not the suite's, or pytest's collector takes it)."""
    if not suite_dirs or file_path.suffix != ".py":
        return None
    if not file_path.name.startswith("test_") or parent.session.isinitpath(file_path):
        return None
    if not any(file_path.is_relative_to(d) for d in suite_dirs if d.is_dir()):
        return None
    patterns = [str(p) for p in parent.config.getini("python_files")]
    if any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return None  # pytest's own Python collector takes it
    return pytest.Module.from_parent(parent, path=file_path)


def tag_clause_tests(items: Sequence[pytest.Item]) -> list[tuple[pytest.Item, tuple[str, ...]]]:
    """Tag each clause test: its IDs (stash, ``-k`` keywords, ``zmq_clauses``), its ``-k``
    expression for replay (``zmq_k``) and whether it is a chaos test (``zmq_chaos``)."""
    tagged: list[tuple[pytest.Item, tuple[str, ...]]] = []
    for item in items:
        ids = _clause_ids(item)
        if ids is None:
            continue
        item.stash[CLAUSES_KEY] = ids
        chaos = item.get_closest_marker("chaos") is not None or all(
            CLAUSES[c].chaos for c in ids
        )
        item.extra_keyword_matches.update(ids)  # so that -k HB-1 or -k CONN selects
        item.user_properties.append(("zmq_clauses", " ".join(ids)))
        item.user_properties.append(("zmq_k", _k_expr(item)))
        if chaos:
            item.user_properties.append(("zmq_chaos", "1"))
        tagged.append((item, ids))
    return tagged


def hold_back_chaos(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item],
    tagged: Sequence[tuple[pytest.Item, tuple[str, ...]]], *, chaos: bool, contract: str,
    suite_dirs: Sequence[Path],
) -> None:
    """Without ``--zmq-chaos``, deselect the chaos tests inside the suite's directories
    (unless their file was named on the command line)."""
    suite_dirs = suite_dirs or _builtin_suite_dirs(contract)
    if not chaos and suite_dirs:
        held = [
            item for item, _ in tagged
            if ("zmq_chaos", "1") in item.user_properties
            and any(item.path.is_relative_to(d) or item.path == d for d in suite_dirs)
            and not session.isinitpath(item.path)
        ]
        if held:
            held_ids = {id(i) for i in held}
            items[:] = [i for i in items if id(i) not in held_ids]
            config.hook.pytest_deselected(items=held)


def longest_first(items: list[pytest.Item],
                  tagged: Sequence[tuple[pytest.Item, tuple[str, ...]]] | None = None) -> None:
    """Reorder ``items`` in place: long tests first, longest first, each followed by
    one short test; then the other short tests in their order.

    Only clause tests (``tagged``; default: every item) count as long: a
    user's own ``long`` marker in the same session means nothing here.

    xdist's ``load`` scheduler hands tests out in collection order, two at a
    time per worker with ``--maxschedchunk=1`` (as the CLI runs it): a long
    test collected last runs alone at the end while the other workers idle.
    Longest first (LPT) leaves only short tests for the end. The short test
    after each long one keeps two long tests out of one worker's first
    hand-out of two.
    """
    suite = None if tagged is None else {id(item) for item, _ in tagged}

    def seconds(item: pytest.Item) -> float:
        if suite is not None and id(item) not in suite:
            return 0.0
        marker = item.get_closest_marker(LONG_MARKER)
        if marker is None:
            return 0.0
        if len(marker.args) != 1 or not isinstance(marker.args[0], (int, float)):
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.{LONG_MARKER}(seconds) takes one number, not "
                f"{marker.args!r}"
            )
        return float(marker.args[0])

    long = sorted((i for i in items if seconds(i) > 0), key=lambda i: -seconds(i))
    if not long:
        return
    short = [i for i in items if seconds(i) <= 0]
    ordered: list[pytest.Item] = []
    for item in long:
        ordered.append(item)
        if short:
            ordered.append(short.pop(0))
    items[:] = ordered + short


def _builtin_suite_dirs(contract: str) -> list[Path]:
    try:
        return selection.suite_paths(chaos=False, contract=contract)
    except ConfigError:
        return []


def _clause_ids(item: pytest.Item) -> tuple[str, ...] | None:
    ids: list[str] = []
    for marker in item.iter_markers("clause"):
        for value in marker.args:
            if not isinstance(value, str) or value not in CLAUSES:
                raise pytest.UsageError(
                    f"{item.nodeid}: @pytest.mark.clause({value!r}) names no known clause; "
                    f"known: {', '.join(CLAUSES)}"
                )
            if value not in ids:
                ids.append(value)
    return tuple(ids) if ids else None


def _k_expr(item: pytest.Item) -> str:
    parts = [item.path.stem]
    cls = getattr(item, "cls", None)
    if cls is not None:
        parts.append(cls.__name__)
    parts.append(getattr(item, "originalname", None) or item.name)
    return " and ".join(dict.fromkeys(parts))
