"""Run supervision: watchdog, postmortem, lifeline, supervisor, re-runs, cleanup between tests."""
