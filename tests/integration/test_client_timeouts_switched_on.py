"""Tests outside tests/unit build clients with the test-wide generous timeouts
(tests/client_timeouts.py, switched on per test by tests/conftest.py), session fixtures
included; a timeout passed explicitly is kept."""

from __future__ import annotations

import pytest

from client_timeouts import TEST_REQUEST_TIMEOUT_MS, TEST_SEND_TIMEOUT_MS
from tidemq.client import Admin, Producer

pytestmark = pytest.mark.integration

NAMESRV = "127.0.0.1:9876"  # never contacted: the clients are built, not started


def test_clients_of_a_test_outside_unit_default_to_the_test_timeouts() -> None:
    producer = Producer("g", NAMESRV)
    assert producer.send_timeout_ms == TEST_SEND_TIMEOUT_MS
    assert producer._instance.request_timeout_ms == TEST_REQUEST_TIMEOUT_MS
    assert Admin(NAMESRV)._instance.request_timeout_ms == TEST_REQUEST_TIMEOUT_MS
    assert Producer("g", NAMESRV, send_timeout_ms=3000).send_timeout_ms == 3000
