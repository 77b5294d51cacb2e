"""Shared fixtures. Real-socket helpers live in tests/servers.py and tests/clients.py."""
