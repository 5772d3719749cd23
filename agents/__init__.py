"""Seat policies: the Agent protocol, the registry and the built-in agents."""
