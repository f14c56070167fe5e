"""Ladder clients: the Python client and CLI (clients.python) and examples in other languages."""
