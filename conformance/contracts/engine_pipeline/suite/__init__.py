"""The engine-pipeline suite (PIPE-1..14)."""
