"""A streaming driver SIGKILLed in the middle of a micro-batch loses and repeats nothing.

The query runs in a child Python process (its own SparkSession and JVM) that this test
starts; once the checkpoint shows a batch planned but not committed (``offsets/N`` without
``commits/N``), the child is killed by its PID with SIGKILL. Spark's gateway JVM exits when
its Python driver's pipe closes; the test waits for the child's whole process group to be
gone before going on. Restarted from the same checkpoint (here, in the test's session),
the query re-runs the interrupted batch with the same offsets, and the file sink's log keeps
each batch's files once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_session import spark_environment
from streaming_queries import run_until_terminated

from tidemq.client.message import Message

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).resolve().parent / "stream_driver.py"
MESSAGES = 600
MAX_OFFSETS_PER_TRIGGER = 100
BATCH_DELAY_S = 1.0
# Bounds on waits, not assertions: a cold child driver needs 20-40 s on a busy machine to
# reach its second batch.
MID_BATCH_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0


def _batch_in_flight(checkpoint: Path) -> int | None:
    """The id of a batch >= 1 that is planned (offsets/N) but not committed, if any."""
    offsets, commits = checkpoint / "offsets", checkpoint / "commits"
    if not offsets.is_dir():
        return None
    planned = {int(p.name) for p in offsets.iterdir() if p.name.isdigit()}
    done = {int(p.name) for p in commits.iterdir() if p.name.isdigit()} \
        if commits.is_dir() else set()
    in_flight = sorted(b for b in planned - done if b >= 1)
    return in_flight[0] if in_flight else None


def _group_alive(group_id: int) -> bool:
    try:
        os.killpg(group_id, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigkill_of_the_driver_mid_batch_then_restart_is_exactly_once(
        spark, cluster, topic_name, tmp_path, spark_scratch):
    cluster.create_topic(topic_name)
    cluster.produce(topic_name, [Message(topic_name, f"crash-{i}".encode())
                                 for i in range(MESSAGES)])
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    scratch = tmp_path / "child-scratch"
    log_path = tmp_path / "child-driver.log"
    env = {**os.environ, **spark_environment(scratch),
           "PYTHONPATH": os.pathsep.join([str(DRIVER.parent), os.environ.get("PYTHONPATH", "")])}
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, str(DRIVER), cluster.namesrv_addr, topic_name, str(checkpoint),
             str(output), str(scratch), str(MAX_OFFSETS_PER_TRIGGER), str(BATCH_DELAY_S)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # its JVM and workers share its process group
        )
    try:
        deadline = time.monotonic() + MID_BATCH_TIMEOUT_S
        killed_in_batch = None
        while time.monotonic() < deadline and child.poll() is None:
            killed_in_batch = _batch_in_flight(checkpoint)
            if killed_in_batch is not None:
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        assert killed_in_batch is not None, (
            "the child driver never had a batch in flight:\n"
            + log_path.read_text(errors="replace")[-4000:])
        child.wait(EXIT_TIMEOUT_S)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while _group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(EXIT_TIMEOUT_S)
        if _group_alive(child.pid):  # its JVM or workers outlived it: ours to stop
            os.killpg(child.pid, signal.SIGKILL)
    assert not (checkpoint / "commits" / str(killed_in_batch)).exists()

    run_until_terminated(
        lambda: spark.readStream.format("tidemq").option("namesrvAddr", cluster.namesrv_addr)
        .option("subscribe", topic_name).option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER)).load()
        .select("msgId", "brokerName", "queueId", "queueOffset", "body")
        .writeStream.format("parquet").option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start())

    rows = spark.read.parquet(str(output)).collect()
    assert len(rows) == MESSAGES
    assert sorted(r.body for r in rows) == sorted(f"crash-{i}".encode() for i in range(MESSAGES))
    assert (checkpoint / "commits" / str(killed_in_batch)).exists()
