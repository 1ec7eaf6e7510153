"""Exactly-once batches on the broker, in-process: transactional SEND_BATCH_MESSAGE, the EOS
commit and abort requests, the check service ending EOS halves, and the decision table.

Requests go through the broker's own handlers; time is moved by the transaction service's
clock (store times stay real), never by sleeping.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tidemq.broker.transaction import Outcome
from tidemq.broker.transaction import exactly_once as broker_eos
from tidemq.broker.transaction.eos_decisions import (
    DECIDED_BATCHES_PER_QUERY_MAX,
    BatchDecision,
    EosDecisions,
)
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
    assert service.eos.decisions.get("query-1", 4).applied


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
        service.eos.decisions.record(BatchDecision(
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
