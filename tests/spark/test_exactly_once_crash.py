"""The exactly-once sink keeps every row exactly once when its driver is SIGKILLed anywhere.

Once for each crash point (crashing_sink.py): after a task stored its rows as half messages,
before any broker commit, between the two brokers' commits, or after both brokers committed
but before Spark recorded the batch — a child Spark driver (its own JVM;
eos_stream_driver.py) copies a topic of unique ids to another topic with ``exactlyOnce=true``
from a checkpoint, several micro-batches long, and SIGKILLs its whole process group at that
point of a micro-batch a seed picks. The query is then restarted from the same checkpoint (in
this test's session) until it finishes, and the output topic must hold every id exactly once:
none lost, none doubled. Every run covers every crash point (a random draw of points, as
before, left some out of a run).

Seeds are printed; ``TIDEMQ_SEED=123 pytest ... -k before_commit`` replays one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crashing_sink import CRASH_POINTS, MARKER_ENV
from spark_session import spark_environment
from streaming_queries import run_until_terminated

from tidemq.client.message import Message

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).resolve().parent / "eos_stream_driver.py"
ROWS = 400
MAX_OFFSETS_PER_TRIGGER = 100  # 400 rows over 8 queues: 4 or more micro-batches
# Uncommitted rows of the killed run are rolled back this long after they were sent. Nothing
# here waits for that rollback (the halves stay hidden either way), but a micro-batch slower
# than the timeout fails its own commit: on a busy machine (load average 13) one took over
# 5 s, so the bound is generous.
TIMEOUT_MS = 60_000
# Bounds on waits, not assertions: a cold child driver needs 20-40 s on a busy machine.
CHILD_TIMEOUT_S = 200.0
EXIT_TIMEOUT_S = 60.0


def _seed() -> int:
    given = os.environ.get("TIDEMQ_SEED", "").strip()
    return int(given) if given else random.SystemRandom().randrange(1_000_000)


def _group_alive(group_id: int) -> bool:
    try:
        os.killpg(group_id, 0)
    except ProcessLookupError:
        return False
    return True


def _run_child_until_it_crashes(args: list[str], log_path: Path, scratch: Path,
                                marker: Path) -> str:
    """Run the child driver until it is gone; what the crash marker says, else its log."""
    env = {**os.environ, **spark_environment(scratch), MARKER_ENV: str(marker),
           "PYTHONPATH": os.pathsep.join([str(DRIVER.parent), os.environ.get("PYTHONPATH", "")])}
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, str(DRIVER), *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # its JVM and Python workers share its process group
        )
    try:
        child.wait(CHILD_TIMEOUT_S)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while _group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(EXIT_TIMEOUT_S)
        if _group_alive(child.pid):  # the group this test started
            os.killpg(child.pid, signal.SIGKILL)
    if marker.exists():
        return marker.read_text()
    return log_path.read_text(errors="replace")


@pytest.mark.parametrize("crash_point", CRASH_POINTS)
def test_sigkill_of_the_driver_anywhere_then_restart_stores_each_row_once(
        spark, cluster, topic_name, tmp_path, crash_point):
    seed = _seed()
    crash_batch = random.Random(seed).randint(0, 2)
    print(f"seed {seed}: SIGKILL in micro-batch {crash_batch} at {crash_point} "
          f"(replay: TIDEMQ_SEED={seed} -k {crash_point})")
    source, target = topic_name + "_in", topic_name + "_out"
    for topic in (source, target):
        cluster.create_topic(topic)
    ids = [f"id-{seed}-{n:04d}".encode() for n in range(ROWS)]
    cluster.produce_to_queues(source, [Message(source, body) for body in ids])
    checkpoint = tmp_path / "checkpoint"

    output = _run_child_until_it_crashes(
        [cluster.namesrv_addr, source, target, str(checkpoint), str(tmp_path / "scratch"),
         str(MAX_OFFSETS_PER_TRIGGER), str(crash_batch), crash_point, str(TIMEOUT_MS)],
        tmp_path / "child-driver.log", tmp_path / "scratch", tmp_path / "crashed")
    assert "crash point reached" in output, output[-4000:]

    run_until_terminated(
        lambda: spark.readStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", source).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER)).load()
        .select("body")
        .writeStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("topic", target).option("exactlyOnce", "true")
        .option("exactlyOnce.timeoutMs", str(TIMEOUT_MS))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start())

    read = (spark.read.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
            .option("subscribe", target).load().select("body").collect())
    bodies = sorted(row.body for row in read)
    missing = sorted(set(ids) - set(bodies))
    doubled = sorted({b for b in bodies if bodies.count(b) > 1})
    assert (missing, doubled) == ([], []), f"seed {seed}: {len(missing)} missing, " \
        f"{len(doubled)} doubled"
    assert len(bodies) == ROWS
