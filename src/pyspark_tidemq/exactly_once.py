"""The exactly-once sink: ``.option("exactlyOnce", "true")``, rows committed once per batch.

Theory of operation
-------------------
*Tasks* (``send``, in executors). Each task execution is a *writer* with a fresh
``writerId`` (Spark's attempt number restarts at 0 when a driver restarts, so it cannot tell
executions apart). Its identity comes from Spark's task context: the query id
(``sql.streaming.queryId``, stable across restarts of one checkpoint), the micro-batch id
(``streaming.sql.batchId``) and the partition. Its rows go out as batches of transactional
half messages carrying that identity (``tidemq.client.exactly_once``): stored by the
brokers, invisible to consumers. Unrouted rows go to the queue their (partition, row index)
hashes to (sink_encoding.py), so a replay of the task sends every row to the same broker.
The task reports, per broker, the half-queue ranges it got back.

*Driver* (``commit(messages, batchId)``). One EOS_COMMIT_BATCH per broker, brokers one after
the other, with every writer's ranges there. A broker commits the listed halves once per
(query id, batch id), writing its decision down first; asked again for the same batch (Spark
replays a batch whose commit it had not recorded when the driver died), it commits nothing
and rolls back the replay's halves. A broker that cannot commit (rows rolled back because
the batch outlived ``exactlyOnce.timeoutMs``) fails the batch with
``ExactlyOnceCommitFailed``: restart the query, Spark replays the batch.

*Nobody commits* (a killed task attempt, a driver killed before its commit, a failed batch):
each broker rolls those halves back once ``exactlyOnce.timeoutMs`` has passed; ``abort``
does it at once when Spark calls it.

Limits (also in the README):

- the query must restart from its checkpoint, and its source must replay a batch with the
  same rows (tidemq and Kafka sources do; a random or wall-clock source does not);
- atomic per broker; across brokers the batch completes when the restarted query replays
  it: a consumer may see one broker's part of a batch before the other's;
- the topic's queues must not change between a run and its replay (routing is by the
  sorted queue list);
- a micro-batch must be committed within ``exactlyOnce.timeoutMs`` of its first rows;
- ``df.write`` (batch): the job's rows become visible together when it commits (per broker);
  running the job again writes them again (no query id ties two jobs together).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from pyspark_tidemq.errors import ExactlyOnceCommitFailed
from pyspark_tidemq.options import SinkOptions
from pyspark_tidemq.sink_encoding import Chunk, exactly_once_queue
from pyspark_tidemq.sink_rows import SinkLayout
from pyspark_tidemq.sink_sender import TaskSender
from pyspark_tidemq.writer import Delivery
from tidemq.client.encoded_batch import BatchSendResult
from tidemq.client.errors import BrokerRejected
from tidemq.client.exactly_once import EosIdentity, WriterHalves
from tidemq.client.exactly_once_sync import ExactlyOnceClient
from tidemq.client.message import MessageQueue
from tidemq.errors import ClientError
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("pyspark_tidemq")

# Spark's task-local properties naming the streaming query and micro-batch (internal keys,
# set on every task of a micro-batch since Spark 2.x; docs/spark.md).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# A commit lost in transport is sent again (a repeat is answered "already committed").
COMMIT_ATTEMPTS = 3
COMMIT_RETRY_PAUSE_S = 1.0


@dataclass
class ExactlyOnceCommitMessage(WriterCommitMessage):
    """What one exactly-once write task reports to the driver (picklable).

    Attributes:
        query_id, batch_id, partition, writer_id: the writer's identity.
        messages: half messages stored.
        requests: send requests made.
        halves: broker name -> the writer's halves there.
        topics: broker name -> a topic written there (its route finds the broker).
    """

    query_id: str
    batch_id: int
    partition: int
    writer_id: str
    messages: int = 0
    requests: int = 0
    halves: dict[str, WriterHalves] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)


class ExactlyOnceDelivery(Delivery):
    """Half messages in tasks, one commit per broker on the driver (module docstring).

    Args:
        options: the sink options.
        job_id: for a batch write (``df.write``), an id made on the driver that stands for
            the query id; None for a streaming query (Spark's query id is used).
    """

    def __init__(self, options: SinkOptions, job_id: str | None = None) -> None:
        self.options = options
        self.job_id = job_id

    @classmethod
    def for_batch_write(cls, options: SinkOptions) -> ExactlyOnceDelivery:
        """A delivery for one ``df.write`` job: its own id, batch id 0."""
        return cls(options, job_id=f"write-{uuid.uuid4().hex}")

    # -- tasks -----------------------------------------------------------------------------

    def _identity(self) -> EosIdentity:
        context = TaskContext.get()
        if context is None:
            raise ExactlyOnceCommitFailed(
                "the exactly-once tidemq sink must run inside a Spark task (no TaskContext)")
        if self.job_id is not None:
            query_id, batch_id = self.job_id, 0
        else:
            query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
            batch_text = context.getLocalProperty(BATCH_ID_PROPERTY)
            if not query_id or batch_text is None or not batch_text.lstrip("-").isdigit():
                raise ExactlyOnceCommitFailed(
                    f"Spark did not give this task its streaming query and batch ids (local "
                    f"properties {QUERY_ID_PROPERTY}={query_id!r}, {BATCH_ID_PROPERTY}="
                    f"{batch_text!r}); the exactly-once sink needs them (pyspark >= 4.2)")
            batch_id = int(batch_text)
        options = self.options
        return EosIdentity(options.producer_group, query_id, batch_id, context.partitionId(),
                           uuid.uuid4().hex, options.exactly_once_timeout_ms)

    def send(self, options: SinkOptions, layout: SinkLayout,
             batches: Iterator[pa.RecordBatch]) -> ExactlyOnceCommitMessage:
        """Send the task's rows as half messages; the report lists where they are."""
        identity = self._identity()
        report = ExactlyOnceCommitMessage(identity.query_id, identity.batch_id,
                                          identity.partition, identity.writer_id)

        def stored(result: BatchSendResult) -> None:
            broker_name = result.queue.broker_name
            halves = report.halves.get(broker_name)
            if halves is None:
                halves = report.halves[broker_name] = WriterHalves(identity.writer_id)
                report.topics[broker_name] = result.queue.topic
            halves.add(result.queue_offset, result.count)
            report.messages += result.count

        def queue_for_block(queues: list[MessageQueue], row_index: int) -> MessageQueue:
            return exactly_once_queue(queues, identity.partition, row_index)

        with ExactlyOnceClient(options.producer_group, options.namesrv_addr,
                               send_timeout_ms=options.send_timeout_ms,
                               credentials=options.credentials) as client:

            def submit(queue: MessageQueue, chunk: Chunk):
                return client.send_half_batch_async(identity, queue, chunk.body, chunk.count)

            sender = TaskSender(options, layout, client.queues, submit, queue_for_block, stored)
            sender.send_all(batches)
        report.requests = sender.requests
        return report

    # -- driver ----------------------------------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None],
               batch_id: int | None) -> None:
        """Commit the batch on every broker its tasks wrote to, one broker after another.

        Raises:
            ExactlyOnceCommitFailed: a broker refused (the batch fails; restart the query).
        """
        reports = _reports(messages)
        if not reports:
            return
        query_id, task_batch_id = _batch_of(reports)
        if batch_id is not None and batch_id != task_batch_id:
            raise ExactlyOnceCommitFailed(
                f"Spark commits batch {batch_id} but its tasks wrote batch {task_batch_id}")
        started = time.perf_counter()
        results = []
        with self._client() as client:
            for broker_name, topic, writers in _by_broker(reports):
                results.append(self._commit_on(client, broker_name, topic, query_id,
                                               task_batch_id, writers))
        replays = [r.broker_name for r in results if r.already_committed]
        log.info(
            "tidemq exactly-once sink: batch %d of query %s committed on %d broker(s), %d "
            "messages (%s) in %.0f ms", task_batch_id, query_id, len(results),
            sum(r.committed_count for r in results),
            f"replay: already committed on {', '.join(replays)}" if replays else "first run",
            (time.perf_counter() - started) * 1000)

    def _commit_on(self, client: ExactlyOnceClient, broker_name: str, topic: str,
                   query_id: str, batch_id: int, writers: list[WriterHalves]):
        group = self.options.producer_group
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return client.commit_batch(broker_name, topic, group, query_id, batch_id,
                                           writers)
            except BrokerRejected as exc:
                raise ExactlyOnceCommitFailed(
                    f"batch {batch_id} of query {query_id} was not committed on broker "
                    f"{broker_name}: {exc}") from exc
            except (RemotingError, ClientError) as exc:
                if attempt == COMMIT_ATTEMPTS:
                    raise ExactlyOnceCommitFailed(
                        f"batch {batch_id} of query {query_id}: broker {broker_name} did not "
                        f"answer the commit after {attempt} attempts ({exc}); restart the "
                        "query from its checkpoint") from exc
                log.warning("commit of batch %d on broker %s failed (%s); trying again",
                            batch_id, broker_name, exc)
                time.sleep(COMMIT_RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    def abort(self, messages: Sequence[WriterCommitMessage | None],
              batch_id: int | None) -> None:
        """Roll back the batch's halves now (best effort: the brokers' timeout does it too)."""
        reports = _reports(messages)
        if not reports:
            return
        query_id, task_batch_id = _batch_of(reports)
        with self._client() as client:
            for broker_name, topic, writers in _by_broker(reports):
                try:
                    client.abort_batch(broker_name, topic, self.options.producer_group,
                                       query_id, task_batch_id, writers)
                except (RemotingError, ClientError) as exc:
                    log.warning("abort of batch %d on broker %s failed (%s); its rows are "
                                "rolled back by timeout", task_batch_id, broker_name, exc)

    def _client(self) -> ExactlyOnceClient:
        options = self.options
        return ExactlyOnceClient(options.producer_group, options.namesrv_addr,
                                 send_timeout_ms=options.send_timeout_ms,
                                 credentials=options.credentials)


def _reports(messages: Sequence[WriterCommitMessage | None]) -> list[ExactlyOnceCommitMessage]:
    return [m for m in messages if isinstance(m, ExactlyOnceCommitMessage)]


def _batch_of(reports: list[ExactlyOnceCommitMessage]) -> tuple[str, int]:
    ids = {(r.query_id, r.batch_id) for r in reports}
    if len(ids) != 1:
        raise ExactlyOnceCommitFailed(f"the tasks of one batch report different ids: {ids}")
    return ids.pop()


def _by_broker(reports: list[ExactlyOnceCommitMessage]
               ) -> Iterator[tuple[str, str, list[WriterHalves]]]:
    """(broker, a topic there, writers' halves there), brokers in name order."""
    writers: dict[str, list[WriterHalves]] = {}
    topics: dict[str, str] = {}
    for report in reports:
        for broker_name, halves in report.halves.items():
            if halves.count:
                writers.setdefault(broker_name, []).append(halves)
                topics.setdefault(broker_name, report.topics[broker_name])
    for broker_name in sorted(writers):
        yield broker_name, topics[broker_name], writers[broker_name]
