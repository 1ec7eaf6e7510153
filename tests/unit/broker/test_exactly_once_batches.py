"""Exactly-once batches on the broker, in-process: transactional SEND_BATCH_MESSAGE, the EOS
commit and abort requests, the check service ending EOS halves, and the decision table.

Requests go through the broker's own handlers; time is moved by the transaction service's
clock (store times stay real), never by sleeping.
"""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest

from tidemq.broker.exactly_once import range_ends
from tidemq.broker.exactly_once import service as broker_eos
from tidemq.broker.exactly_once.decisions import (
    DECIDED_BATCHES_PER_QUERY_MAX,
    BatchDecision,
    EosDecisions,
)
from tidemq.broker.exactly_once.records import eos_committed_message
from tidemq.broker.transaction import Outcome
from tidemq.broker.transaction.service import wall_clock_ms
from tidemq.client import exactly_once as client_eos
from tidemq.client.exactly_once import EosIdentity, WriterHalves
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import (
    BatchEntry,
    decode_records,
    encode_batch_body,
    encode_properties,
)
from tidemq.store.interface import PutStatus
from tidemq.store.record_encoder import index_keys

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TOPIC = "Orders"
GROUP = "eos-writer"
WAIT_BOUND_S = 10.0


def half_batch(identity: EosIdentity, bodies: list[bytes], *, queue_id: int = 1,
               sys_flag: int = 4, properties: dict[str, str] | None = None) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group=GROUP, topic=TOPIC, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=queue_id, sys_flag=sys_flag, born_timestamp=wall_clock_ms(), flag=0,
        properties=encode_properties(identity.batch_properties() if properties is None
                                     else properties),
        batch=True,
    )
    body = encode_batch_body([BatchEntry(b) for b in bodies])
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, header.to_ext_fields(), body)


def eos_request(code: int, query_id: str, batch_id: int,
                writers: list[WriterHalves]) -> RemotingCommand:
    fields = {"producerGroup": GROUP, "queryId": query_id, "batchId": str(batch_id)}
    body = jsonx.dumps({"writers": [w.to_json() for w in writers]})
    return RemotingCommand.request(code, fields, body)


def stored(broker, topic: str, queue_id: int = 0):
    result = broker.store.get_messages(topic, queue_id, 0, 1024, 16 * 1024 * 1024)
    return decode_records(result.body)


def run(coro):
    async def bounded():
        async with asyncio.timeout(WAIT_BOUND_S):
            return await coro
    return asyncio.run(bounded())


def identity(batch_id: int = 0, timeout_ms: int = 60_000) -> EosIdentity:
    return EosIdentity(GROUP, "query-1", batch_id, 0, uuid.uuid4().hex, timeout_ms)


async def send_halves(table, writer: EosIdentity, bodies: list[bytes]) -> WriterHalves:
    response = await table.ask(half_batch(writer, bodies))
    assert response.code == ResponseCode.SUCCESS, response.remark
    halves = WriterHalves(writer.writer_id)
    halves.add(int(response.ext_fields["queueOffset"]), len(bodies))
    return halves


def test_property_names_are_the_same_on_client_and_broker():
    assert (client_eos.PROPERTY_EOS_QUERY_ID, client_eos.PROPERTY_EOS_BATCH_ID,
            client_eos.PROPERTY_EOS_PARTITION, client_eos.PROPERTY_EOS_WRITER_ID) == (
        broker_eos.PROPERTY_EOS_QUERY_ID, broker_eos.PROPERTY_EOS_BATCH_ID,
        broker_eos.PROPERTY_EOS_PARTITION, broker_eos.PROPERTY_EOS_WRITER_ID)


def test_a_transactional_batch_is_stored_as_halves_in_one_put(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    writer = identity()

    async def scenario():
        return await table.ask(half_batch(writer, [b"a", b"b", b"c"]))

    response = run(scenario())
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["queueId"] == "1"
    halves = stored(broker, HALF_TOPIC)
    assert [h.body for h in halves] == [b"a", b"b", b"c"]
    assert [h.queue_offset for h in halves] == [0, 1, 2]
    assert response.ext_fields["queueOffset"] == "0"
    assert {h.properties["REAL_TOPIC"] for h in halves} == {TOPIC}
    assert {h.properties["EOS_WRITER_ID"] for h in halves} == {writer.writer_id}
    assert stored(broker, TOPIC, 1) == []


def test_a_prepared_batch_without_tran_msg_is_refused(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    response = run(table.ask(half_batch(identity(), [b"a"], properties={"PGROUP": GROUP})))
    assert response.code == ResponseCode.MESSAGE_ILLEGAL
    assert "TRAN_MSG" in response.remark
    assert stored(broker, HALF_TOPIC) == []


def test_commit_stores_rows_without_eos_properties_and_remembers_the_batch(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)

    async def scenario():
        halves = await send_halves(table, identity(batch_id=4), [b"x", b"y"])
        first = await table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 4,
                                            [halves]))
        replay = await send_halves(table, identity(batch_id=4), [b"x", b"y"])
        second = await table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 4,
                                             [replay]))
        return halves, replay, first, second

    _, replay, first, second = run(scenario())
    assert first.code == ResponseCode.SUCCESS
    assert first.ext_fields == {"committedCount": "2", "alreadyCommitted": "false",
                                "rolledBackCount": "0"}
    assert second.ext_fields == {"committedCount": "2", "alreadyCommitted": "true",
                                 "rolledBackCount": "2"}
    committed = stored(broker, TOPIC, 1)
    assert [m.body for m in committed] == [b"x", b"y"]
    for message in committed:
        assert not any(name.startswith("EOS_") for name in message.properties)
        assert "CHECK_IMMUNITY_TIME_IN_SECONDS" not in message.properties
    service = broker.transaction_service
    first_offset = replay.ranges[0][0]
    assert service.outcome(first_offset) == (True, Outcome.ROLLBACK)
    assert service.batches.decisions.get("query-1", 4).applied


def test_a_malformed_commit_is_refused_naming_the_field(broker, handlers):
    table = handlers(broker)
    bad = RemotingCommand.request(RequestCode.EOS_COMMIT_BATCH,
                                  {"producerGroup": GROUP, "queryId": "q", "batchId": "x"},
                                  b'{"writers": []}')
    response = run(table.ask(bad))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "batchId" in response.remark
    mismatch = RemotingCommand.request(
        RequestCode.EOS_COMMIT_BATCH, {"producerGroup": GROUP, "queryId": "q", "batchId": "1"},
        b'{"writers": [{"writerId": "w", "count": 3, "ranges": [[0, 2]]}]}')
    response = run(table.ask(mismatch))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "count is 3 but its ranges hold 2" in response.remark


def test_due_eos_halves_are_rolled_back_unless_their_batch_was_decided(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    service = broker.transaction_service

    async def scenario():
        undecided = await send_halves(table, identity(batch_id=1, timeout_ms=1_000), [b"u"])
        decided = await send_halves(table, identity(batch_id=2, timeout_ms=1_000), [b"d"])
        # A decision the broker wrote but did not apply (as after a crash mid-commit).
        service.batches.decisions.record(BatchDecision(
            "query-1", 2, GROUP, 1, wall_clock_ms(), {decided.writer_id: decided.ranges}))
        service.clock_ms = lambda: wall_clock_ms() + 5_000
        await service.tick()
        await asyncio.sleep(0)  # the end writer's flush
        return undecided, decided

    undecided, decided = run(scenario())
    assert service.outcome(undecided.ranges[0][0]) == (True, Outcome.ROLLBACK)
    assert service.outcome(decided.ranges[0][0]) == (True, Outcome.COMMIT)
    assert [m.body for m in stored(broker, TOPIC, 1)] == [b"d"]


def test_decisions_survive_a_reload_and_applied_ones_are_bounded(tmp_path):
    path = tmp_path / "eosCommits.json"
    decisions = EosDecisions(path)
    open_one = BatchDecision("q", 0, GROUP, 5, 1, {"w0": [(10, 5)]})
    decisions.record(open_one)
    for batch_id in range(1, DECIDED_BATCHES_PER_QUERY_MAX + 10):
        decision = BatchDecision("q", batch_id, GROUP, 1, 1 + batch_id, {"w": [(batch_id, 1)]})
        decisions.record(decision)
        decisions.mark_applied(decision)
    decisions.write(decisions.snapshot())
    reloaded = EosDecisions(path)
    assert reloaded.get("q", 0).writers == {"w0": [(10, 5)]}  # never dropped while open
    assert [d.batch_id for d in reloaded.unapplied()] == [0]
    assert len(reloaded) <= DECIDED_BATCHES_PER_QUERY_MAX + 1
    latest = reloaded.get("q", DECIDED_BATCHES_PER_QUERY_MAX + 9)
    assert latest.applied and latest.writers == {"w": []} and latest.count == 1


@pytest.mark.parametrize("code", [RequestCode.EOS_COMMIT_BATCH, RequestCode.EOS_ABORT_BATCH])
def test_a_slave_refuses_exactly_once_requests(make_broker, handlers, code):
    slave = make_broker(broker_role="SLAVE", broker_id=1)
    response = run(handlers(slave).ask(eos_request(code, "q", 0, [])))
    assert response.code == ResponseCode.SLAVE_NOT_AVAILABLE


# -- prepared ranges: EOS halves tracked per batch, not per half -----------------------------


def test_the_check_scan_passes_prepared_halves_without_making_them_pending(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    service = broker.transaction_service

    async def scenario():
        await service.ready()
        first = await send_halves(table, identity(batch_id=1), [b"a", b"b", b"c"])
        second = await send_halves(table, identity(batch_id=1), [b"d", b"e"])
        service.clock_ms = lambda: wall_clock_ms() + 5_000  # old enough to scan, not due
        await service.tick()
        return first, second

    first, second = run(scenario())
    progress = service.progress
    assert progress.scan_offset == 5
    assert progress.pending == {}
    assert service.outcome(first.ranges[0][0]) == (False, None)
    assert service.outcome(second.ranges[0][0] + 1) == (False, None)
    checkpoint = progress.checkpoint(service.op_queue_end())
    assert checkpoint.prepared_ranges == [(0, 3), (3, 2)]
    assert stored(broker, TOPIC, 1) == []


def test_a_due_prepared_range_is_rolled_back_as_a_whole_with_one_op_record(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    service = broker.transaction_service

    async def scenario():
        await service.ready()
        halves = await send_halves(table, identity(timeout_ms=1_000), [b"a", b"b", b"c"])
        service.clock_ms = lambda: wall_clock_ms() + 5_000
        await service.tick()
        return halves

    halves = run(scenario())
    first = halves.ranges[0][0]
    assert [service.outcome(first + i) for i in range(3)] == [(True, Outcome.ROLLBACK)] * 3
    ops = stored(broker, "RMQ_SYS_TRANS_OP_HALF_TOPIC")
    assert [op.body for op in ops] == [b"0,1,2"]
    assert service.progress.checkpoint(service.op_queue_end()).prepared_ranges == []
    assert stored(broker, TOPIC, 1) == []


def test_a_range_with_a_half_ended_on_its_own_is_not_committed(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    service = broker.transaction_service

    async def scenario():
        await service.ready()
        halves = await send_halves(table, identity(batch_id=3), [b"a", b"b", b"c"])
        one = decode_records(broker.store.get_messages(HALF_TOPIC, 0, 1, 1, 1 << 20).body)[0]
        await service.writer.end(one, Outcome.ROLLBACK)  # as an END_TRANSACTION would
        return await table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 3,
                                           [halves]))

    response = run(scenario())
    assert response.code == ResponseCode.EOS_BATCH_INCOMPLETE
    assert "already rolled back" in response.remark
    assert stored(broker, TOPIC, 1) == []


def test_open_ranges_survive_a_restart_and_a_decided_one_is_committed_once(
        make_broker, handlers, tmp_path):
    root = tmp_path / "store"
    broker = make_broker(store_kind="file", root=root)
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)

    async def before():
        service = broker.transaction_service
        await service.ready()
        decided = await send_halves(table, identity(batch_id=7), [b"d1", b"d2"])
        undecided = await send_halves(table, identity(batch_id=8), [b"u"])
        await service.tick()
        # Decided, not applied: as when the broker is killed right after writing it.
        service.batches.decisions.record(BatchDecision("query-1", 7, GROUP, 2, wall_clock_ms(),
                                                   {decided.writer_id: decided.ranges}))
        await service.persist()  # the checkpoint (with the open ranges) and the decision
        await broker.shutdown(grace_s=1.0)
        return decided, undecided

    _, undecided = run(before())
    broker = make_broker(store_kind="file", root=root)
    service = broker.transaction_service

    async def after():
        await service.ready()
        restored = service.progress.prepared.spans()
        await service.batches.finish_decided()
        service.clock_ms = lambda: wall_clock_ms() + 120_000  # past the halves' timeout
        await service.tick()
        await asyncio.sleep(0)
        return restored

    restored = run(after())
    assert restored == [(0, 2), (2, 1)]
    assert [m.body for m in stored(broker, TOPIC, 1)] == [b"d1", b"d2"]
    assert service.outcome(undecided.ranges[0][0]) == (True, Outcome.ROLLBACK)
    assert service.batches.decisions.get("query-1", 7).applied


@pytest.mark.parametrize("row_properties", [
    [{"TAGS": "t", "KEYS": f"k{i}"} for i in range(20)],  # every row names the same ones
    [{"KEYS": f"k{i}"} if i % 3 else {"TAGS": "odd", "color": "red"} for i in range(20)],
])
def test_committed_rows_keep_their_own_properties_and_lose_the_eos_ones(
        broker, handlers, row_properties):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    writer = identity(batch_id=9)
    request = half_batch(writer, [])
    request.body = encode_batch_body([
        BatchEntry(b"row-%d" % i, encode_properties(props))
        for i, props in enumerate(row_properties)])

    async def scenario():
        response = await table.ask(request)
        assert response.code == ResponseCode.SUCCESS, response.remark
        halves = WriterHalves(writer.writer_id)
        halves.add(int(response.ext_fields["queueOffset"]), len(row_properties))
        return await table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 9,
                                           [halves]))

    assert run(scenario()).code == ResponseCode.SUCCESS
    committed = stored(broker, TOPIC, 1)
    assert [m.body for m in committed] == [b"row-%d" % i for i in range(len(row_properties))]
    for message, props in zip(committed, row_properties, strict=True):
        assert {k: message.properties[k] for k in props} == props
        assert message.properties["PGROUP"] == GROUP and "UNIQ_KEY" in message.properties
        assert not {"REAL_TOPIC", "REAL_QID", "TRAN_MSG", "CHECK_IMMUNITY_TIME_IN_SECONDS"} & set(
            message.properties)
        assert not any(name.startswith("EOS_") for name in message.properties)
        assert message.transaction_type == 8  # a committed transactional message


@pytest.mark.parametrize("row_properties", [
    [{} for _ in range(30)],  # the sink's rows: the broker gives each a UNIQ_KEY
    [{"TAGS": f"t{i % 3}", "KEYS": f"k{i} shared", "pct": "50%"} for i in range(30)],
    [{"UNIQ_KEY": f"U{i:030d}", "KEYS": f"k{i}"} for i in range(30)],
])
def test_a_range_commits_by_columns_to_the_per_half_rules_bytes(broker, handlers,
                                                                row_properties):
    # The column path (range_ends.committed_columns) must store what the per-half rule
    # (eos_committed_message) stores: same bytes, tag codes, index keys and prepared offsets.
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    writer = identity(batch_id=3)
    request = half_batch(writer, [])
    request.body = encode_batch_body([
        BatchEntry(b"row-%d" % i, encode_properties(props))
        for i, props in enumerate(row_properties)])
    response = run(table.ask(request))
    assert response.code == ResponseCode.SUCCESS, response.remark
    first, count = int(response.ext_fields["queueOffset"]), len(row_properties)
    service = broker.transaction_service
    parts = range_ends.read_range_bytes(service, first, count)
    batch = range_ends.committed_columns(parts, first, count, ("query-1", "3", writer.writer_id))
    assert batch is not None, "the sink's ranges must take the column path"
    halves = range_ends.read_range(service, first, count)
    expected = [eos_committed_message(half) for half in halves]
    assert batch.prepared_transaction_offsets == [half.physical_offset for half in halves]
    by_columns = batch.to_store_messages()
    for made, wanted in zip(by_columns, expected, strict=True):
        assert (made.topic, made.queue_id, made.body, made.flag, made.sysflag,
                made.born_timestamp, made.born_host, made.reconsume_times,
                made.prepared_transaction_offset) == (
            wanted.topic, wanted.queue_id, wanted.body, wanted.flag, wanted.sysflag,
            wanted.born_timestamp, wanted.born_host, wanted.reconsume_times,
            wanted.prepared_transaction_offset)
        assert made.properties_text == encode_properties(wanted.properties)
    assert [list(keys) for keys in batch.keys] == [index_keys(m.properties) for m in expected]
    assert batch.tags == (None if "TAGS" not in row_properties[0]
                          else [m.properties["TAGS"] for m in expected])
    # The copies made when the halves were stored (prepared_ranges.CommittedCopies) give
    # the same batch, with the bodies taken from the stored halves.
    prepared = service.progress.prepared.find(first)
    assert prepared is not None and prepared.copies is not None
    from_copies = range_ends.committed_from_copies(service, prepared)
    assert from_copies is not None and prepared.copies is None
    assert service.progress.prepared.copies_bytes == 0
    assert from_copies.prepared_transaction_offsets == batch.prepared_transaction_offsets
    assert list(map(bytes, from_copies.bodies)) == batch.bodies
    assert from_copies.properties == batch.properties
    assert [list(keys) for keys in from_copies.keys] == [list(keys) for keys in batch.keys]
    assert (from_copies.tags, from_copies.body_crcs, from_copies.sysflag) == (
        batch.tags, batch.body_crcs, batch.sysflag)
    # Stored through put_batch, the records are those put_messages makes of the rule's.
    assert broker.store.put_batch(batch).status is PutStatus.PUT_OK
    assert broker.store.put_messages(expected).status is PutStatus.PUT_OK
    assert broker.store.put_batch(from_copies).status is PutStatus.PUT_OK
    records = _records_without_store_fields(broker.store, TOPIC, 1, 3 * count)
    assert records[:count] == records[count:2 * count] == records[2 * count:]


def test_committed_copies_stay_within_their_budget_and_commit_the_same(broker, handlers):
    # Ranges beyond exactlyOnceCommitCacheBytes keep no copies; their commit parses the
    # stored halves. Both kinds commit every row once.
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    prepared_table = broker.transaction_service.progress.prepared
    writer = identity(batch_id=4)
    bodies = [b"row-%d" % i for i in range(40)]

    async def scenario():
        halves = WriterHalves(writer.writer_id)
        for part in range(4):
            response = await table.ask(half_batch(writer, bodies[part * 10:part * 10 + 10]))
            assert response.code == ResponseCode.SUCCESS, response.remark
            halves.add(int(response.ext_fields["queueOffset"]), 10)
            if part == 0:
                # Room for this range's copies and one more: the last two keep none.
                prepared_table.copies_max_bytes = 2 * prepared_table.copies_bytes
        with_copies = [r.copies is not None for r in prepared_table]
        used = prepared_table.copies_bytes
        answer = await table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 4,
                                             [halves]))
        return with_copies, used, answer

    with_copies, used, answer = run(scenario())
    assert with_copies == [True, True, False, False]
    assert used <= prepared_table.copies_max_bytes
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert prepared_table.copies_bytes == 0 and len(prepared_table) == 0
    assert [m.body for m in stored(broker, TOPIC, 1)] == bodies


def test_committed_copies_that_do_not_match_the_stored_halves_are_not_used(broker, handlers):
    broker.topic_config_manager.create_topic_for_send_back(TOPIC, 4, 6)
    table = handlers(broker)
    writer = identity(batch_id=5)
    response = run(table.ask(half_batch(writer, [b"a", b"b", b"c"])))
    first = int(response.ext_fields["queueOffset"])
    service = broker.transaction_service
    prepared = service.progress.prepared.find(first)
    assert prepared is not None and prepared.copies is not None
    prepared.copies.physical_offset += 1  # no record starts there
    assert range_ends.committed_from_copies(service, prepared) is None
    assert prepared.copies is None  # forgotten: the commit parses the halves instead
    halves = WriterHalves(writer.writer_id)
    halves.add(first, 3)
    answer = run(table.ask(eos_request(RequestCode.EOS_COMMIT_BATCH, "query-1", 5, [halves])))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    assert [m.body for m in stored(broker, TOPIC, 1)] == [b"a", b"b", b"c"]


def _records_without_store_fields(store, topic: str, queue_id: int, count: int) -> list[bytes]:
    # QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP differ between two puts of the same.
    found = store.get_messages(topic, queue_id, 0, count, 1 << 30)
    assert found.message_count == count
    records, position = [], 0
    while position < len(found.body):
        (size,) = struct.unpack_from(">i", found.body, position)
        record = bytearray(found.body[position:position + size])
        for start, length in ((20, 8), (28, 8), (56, 8)):
            record[start:start + length] = bytes(length)
        records.append(bytes(record))
        position += size
    return records
