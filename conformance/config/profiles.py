"""Depth profiles: how hard the suite tries.

``ci`` is the default: every clause, few examples, fast enough for a gate on
every push. ``dev`` digs a little deeper for local work; ``thorough`` is for
nightly runs. A profile only governs the suite's own tests: the user's other
Hypothesis tests keep their own settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # Hypothesis is imported where settings are built: the CLI never needs it
    from hypothesis import settings

from conformance.errors import ConfigError


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    max_examples: int
    stateful_step_count: int
    #: Multiplier for loop counts of example tests (flapping cycles, floods).
    repeat_scale: float


PROFILES: Final[dict[str, Profile]] = {
    p.name: p
    for p in (
        Profile("ci", "fast gate for every push", max_examples=15, stateful_step_count=25,
                repeat_scale=1.0),
        Profile("dev", "deeper local runs", max_examples=60, stateful_step_count=40,
                repeat_scale=2.0),
        Profile("thorough", "nightly depth", max_examples=400, stateful_step_count=80,
                repeat_scale=5.0),
    )
}

DEFAULT_PROFILE: Final = "ci"

_active: Profile = PROFILES[DEFAULT_PROFILE]


def activate(name: str) -> Profile:
    """Make ``name`` the active profile (before the suite's modules are imported)."""
    global _active
    try:
        _active = PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"--zmq-profile={name!r}: unknown profile; choose one of {', '.join(PROFILES)}"
        ) from None
    return _active


def active() -> Profile:
    return _active


def suite_settings(**overrides: Any) -> settings:
    """Hypothesis settings for a suite test under the active profile.

    Deadlines are off (network round trips vary); the database stays on so
    a failure replays first on the next run; ``function_scoped_fixture`` is
    suppressed because suite tests build fresh nodes per example themselves.
    """
    from hypothesis import HealthCheck, Phase, settings

    profile = _active
    values: dict[str, Any] = {
        "max_examples": profile.max_examples,
        "stateful_step_count": profile.stateful_step_count,
        "deadline": None,
        "suppress_health_check": [HealthCheck.function_scoped_fixture,
                                  HealthCheck.too_slow, HealthCheck.data_too_large],
        "phases": tuple(Phase),
        "print_blob": True,
        "report_multiple_bugs": False,
    }
    values.update(overrides)
    return settings(**values)


def scaled(count: int) -> int:
    """``count`` times the active profile's ``repeat_scale`` (at least 1).

    Loop counts of example tests (flapping cycles, floods) go through this, so
    ``--zmq-profile thorough`` digs deeper without touching the tests.
    """
    return max(1, round(count * active().repeat_scale))
