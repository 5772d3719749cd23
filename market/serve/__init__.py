"""Serving the market over HTTP: served matches with remote seats."""
