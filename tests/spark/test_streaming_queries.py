"""streaming_queries.py starts a query again only after Spark's connect-back failure at start.

Fake queries stand in for Spark's (no SparkSession): the rule is about which failure is
retried, and a real connect-back timeout needs a machine busier than a test can make it.
"""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException
from streaming_queries import (
    CONNECT_BACK_FAILURE,
    START_ATTEMPTS,
    run_until_terminated,
    start_and_process_available,
)

pytestmark = pytest.mark.spark

# The words Spark 4.3 ended a query with on a machine at load average 12 (tests/spark, 2026-11-26).
CONNECT_BACK_TEXT = (f"[STREAM_FAILED] Query [id = q, runId = r] terminated with exception: "
                     f"{CONNECT_BACK_FAILURE}. SQLSTATE: XXKST")


class FakeQuery:
    """A query whose wait raises ``failure`` (if any) after ``progress`` batches."""

    def __init__(self, failure: str | None = None, progress: int = 0) -> None:
        self.id = f"fake-{id(self)}"
        self.failure = failure
        self.recentProgress = [{"batchId": n} for n in range(progress)]
        self.waits: list[float | None] = []

    def _wait(self, timeout_s: float | None = None) -> None:
        self.waits.append(timeout_s)
        if self.failure is not None:
            raise StreamingQueryException(message=self.failure)

    def awaitTermination(self, timeout_s: float | None = None) -> None:
        self._wait(timeout_s)

    def processAllAvailable(self) -> None:
        self._wait()


def starter(*queries: FakeQuery):
    started: list[FakeQuery] = []
    pending = list(queries)

    def start() -> FakeQuery:
        started.append(pending.pop(0))
        return started[-1]

    return start, started


def test_a_query_whose_source_process_never_connected_back_is_started_again():
    start, started = starter(FakeQuery(CONNECT_BACK_TEXT), FakeQuery())

    ended = run_until_terminated(start)

    assert started[0].waits == [None] and ended is started[1]


def test_a_long_running_query_is_started_again_too_and_a_bounded_wait_keeps_its_bound():
    start, started = starter(FakeQuery(CONNECT_BACK_TEXT), FakeQuery())
    assert start_and_process_available(start) is started[1]

    start, started = starter(FakeQuery(CONNECT_BACK_TEXT), FakeQuery())
    run_until_terminated(start, timeout_s=42.0)
    assert [q.waits for q in started] == [[42.0], [42.0]]


@pytest.mark.parametrize("failing", [
    FakeQuery("[STREAM_FAILED] ... set option failOnDataLoss=false"),  # any other failure
    FakeQuery(CONNECT_BACK_TEXT, progress=2),  # after batches: not a start-up failure
], ids=["other failure", "after progress"])
def test_any_other_failure_is_raised_at_once(failing):
    start, started = starter(failing, FakeQuery())

    with pytest.raises(StreamingQueryException):
        run_until_terminated(start)
    assert started == [failing]


def test_the_last_attempt_fails_the_test():
    start, started = starter(*(FakeQuery(CONNECT_BACK_TEXT) for _ in range(START_ATTEMPTS)))

    with pytest.raises(StreamingQueryException, match=CONNECT_BACK_FAILURE):
        run_until_terminated(start)
    assert len(started) == START_ATTEMPTS
