"""Start a streaming query, starting it again only when Spark could not start its Python
streaming-source process in time (a busy machine), never for any other failure.

A ``readStream.format("tidemq")`` query runs the source's planning side (offsets, partitions)
in one Python process the driver's JVM starts when the query initialises
(PythonStreamingSourceRunner). Spark gives that process a fixed 10 s, not configurable, to
import PySpark and connect back; under a load average of 10-20 it sometimes takes longer and
the query fails in state INITIALIZING with "Python worker failed to connect back", before
any batch is planned. That failure is on the driver, not in a task, so Spark's task retry
(``spark.task.maxFailures``, ``local[N,F]``) never sees it.

Such a query has read nothing, written nothing and recorded nothing in its checkpoint, so
starting it again is what an operator would do and changes no result a test checks. Any
other failure, or this one after the query made progress, is raised as it is; so is the
third such failure in a row.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

CONNECT_BACK_FAILURE = "Python worker failed to connect back"
START_ATTEMPTS = 3


def run_until_terminated(start: Callable[[], Any], timeout_s: float | None = None) -> Any:
    """``start()`` a query and wait for its end (``availableNow``): the ended query.

    With ``timeout_s``, waits at most that long and returns the query, ended or not.
    """

    def wait(query: Any) -> None:
        if timeout_s is None:
            query.awaitTermination()
        else:
            query.awaitTermination(timeout_s)

    return _start_with_retry(start, wait)


def start_and_process_available(start: Callable[[], Any]) -> Any:
    """``start()`` a long-running query and wait until it processed the data available."""
    return _start_with_retry(start, lambda query: query.processAllAvailable())


def failed_to_start_its_source(query: Any, error: BaseException) -> bool:
    """True if ``query`` failed before any progress because its Python streaming source
    process did not connect back to the JVM in Spark's fixed time."""
    return CONNECT_BACK_FAILURE in str(error) and not query.recentProgress


def _start_with_retry(start: Callable[[], Any], wait: Callable[[Any], None]) -> Any:
    from pyspark.errors import StreamingQueryException

    for attempt in range(1, START_ATTEMPTS + 1):
        query = start()
        try:
            wait(query)
        except StreamingQueryException as error:
            if attempt == START_ATTEMPTS or not failed_to_start_its_source(query, error):
                raise
            # Printed, not warned: the suite turns warnings into errors. pytest shows it with
            # the test's output, so a run that needed it says so.
            print(f"streaming query {query.id}: its Python source process did not connect "
                  f"back in time (attempt {attempt} of {START_ATTEMPTS}); starting it again",
                  file=sys.stderr, flush=True)
            continue
        return query
    raise AssertionError("unreachable: the last attempt returns or raises")
