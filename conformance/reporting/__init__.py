"""Verdicts and reports: clause verdicts, the run report and its files, expected failures."""
