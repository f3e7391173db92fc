"""Test tools two or more families use: hosts and ports, descriptor counting, MessagePack values."""
