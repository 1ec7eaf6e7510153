"""Integration tests use the real-process fixtures of tests/conftest.py (tidemq_cluster,
tidemq_server, remoting_call, remoting_session, free_port, wait_until, ...).

The names below are kept for tests/spark/conftest.py, which loads this file by path for
``ServerProcess``, ``TEST_BROKER_SETTINGS`` and ``wait_until``; new code imports them from
``server_processes`` (tests/server_processes.py) instead.
"""

from server_processes import TEST_BROKER_SETTINGS, ServerProcess, wait_until

__all__ = ["TEST_BROKER_SETTINGS", "ServerProcess", "wait_until"]
