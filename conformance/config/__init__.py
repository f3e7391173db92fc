"""Run configuration both faces share: implementation, capabilities, contract, suite, profiles."""
