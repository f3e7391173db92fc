"""The engine-pipeline chaos suite: network faults between client and engine (toxiproxy)."""
