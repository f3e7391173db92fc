"""Run configuration shared by both faces: implementation, capabilities, contract, suite, profiles, fixtures."""
