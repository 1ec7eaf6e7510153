"""Generous client timeouts for the tests that run real servers, set in this one place.

The client's defaults are RocketMQ's: a send's whole budget is 3 s (sendMsgTimeout) and every
other request gets 3 s (mqClientApiTimeout). A test's first request meets a fresh route and
connection: a route lookup at the name server, a connect, perhaps a topic created by the
broker. At a load of 20 on 2 cores (Spark JVMs starting beside other runs) that used a whole
3 s: "used its whole timeout of 3000 ms before a broker could be tried" (the bit-flip store's
set-up, the console's first send). Tests that set up data or drive a scenario are not about
those timeouts, so while a test outside tests/unit runs (its fixtures included, session ones
too), the client classes are built with ``TEST_SEND_TIMEOUT_MS`` and
``TEST_REQUEST_TIMEOUT_MS`` unless the caller passes its own: a test about timeouts passes
them explicitly and keeps them. tests/conftest.py switches this on and off per test; unit tests
keep the real defaults (their fakes answer in-process, and some check what a default does).

Only the defaults change, on the classes every client goes through (the ``tidemq.sync`` twins
and ``TransactionProducer`` pass their options on to these). A client that a test runs in a
child process gets the same defaults when the test starts the child with
``child_pythonpath()`` first on its PYTHONPATH: switched on, this module also sets
``TIDEMQ_TEST_CLIENT_TIMEOUTS=generous`` in the environment children inherit, and
child_site/sitecustomize.py switches them on in the child (the push-consumer group members of
tests/integration/test_push_failover.py; Spark's Python workers, spark_session.py).
Server processes are started without it and never pay for importing the client.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tidemq.client import Admin, Producer, PullConsumer, PushConsumer
from tidemq.client.encoded_batch import EncodedBatchSender

# Bounds, not expectations: a healthy first send takes milliseconds; these only keep a test
# from failing while the machine is busy with other work.
TEST_SEND_TIMEOUT_MS = 30_000
TEST_REQUEST_TIMEOUT_MS = 30_000

# Set (to "generous") while the test timeouts are on: child processes inherit it.
CHILD_TIMEOUTS_ENV = "TIDEMQ_TEST_CLIENT_TIMEOUTS"
# The folder whose sitecustomize.py reads it in a child (first on the child's PYTHONPATH).
CHILD_SITE_DIR = Path(__file__).resolve().parent / "child_site"

_GENEROUS: tuple[tuple[Callable[..., Any], Mapping[str, int]], ...] = (
    (Producer.__init__, {"send_timeout_ms": TEST_SEND_TIMEOUT_MS,
                         "request_timeout_ms": TEST_REQUEST_TIMEOUT_MS}),
    (EncodedBatchSender.__init__, {"send_timeout_ms": TEST_SEND_TIMEOUT_MS,
                                   "request_timeout_ms": TEST_REQUEST_TIMEOUT_MS}),
    (PullConsumer.__init__, {"request_timeout_ms": TEST_REQUEST_TIMEOUT_MS}),
    (PushConsumer.__init__, {"request_timeout_ms": TEST_REQUEST_TIMEOUT_MS}),
    (Admin.__init__, {"request_timeout_ms": TEST_REQUEST_TIMEOUT_MS}),
)


def _client_defaults() -> tuple[tuple[Callable[..., Any], Mapping[str, int]], ...]:
    """The client's own defaults of the parameters in ``_GENEROUS``, as imported."""
    real = []
    for function, values in _GENEROUS:
        defaults = function.__kwdefaults__ or {}
        missing = sorted(set(values) - set(defaults))
        if missing:
            raise RuntimeError(
                f"{function.__qualname__} has no keyword-only parameter {missing} with a "
                "default any more: update _GENEROUS in tests/client_timeouts.py to the "
                "client's current timeout parameters")
        real.append((function, {name: defaults[name] for name in values}))
    return tuple(real)


_REAL = _client_defaults()


def use_generous_client_timeouts(generous: bool) -> None:
    """Make clients built from now on default to the test timeouts (True) or to the client's
    own defaults again (False). Clients built already keep what they were built with.
    Child processes started from now on with ``child_pythonpath()`` follow the same switch."""
    for function, values in _GENEROUS if generous else _REAL:
        function.__kwdefaults__.update(values)
    if generous:
        os.environ[CHILD_TIMEOUTS_ENV] = "generous"
    else:
        os.environ.pop(CHILD_TIMEOUTS_ENV, None)


def child_pythonpath(pythonpath: str | None = None) -> str:
    """The PYTHONPATH for a child process whose clients should follow this switch:
    ``CHILD_SITE_DIR`` first, then ``pythonpath`` (default: this process's PYTHONPATH)."""
    if pythonpath is None:
        pythonpath = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(part for part in (str(CHILD_SITE_DIR), pythonpath) if part)
