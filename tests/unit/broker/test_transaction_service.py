"""Transactional messages on the broker: halves, END_TRANSACTION, checks, discards, restarts.

Halves are sent with SEND_MESSAGE_V2 and ended with END_TRANSACTION through the broker's own
handlers; checks travel over loopback to a RemotingClient that plays the producer. Time is
moved by the service's clock (store times stay real), never by sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tidemq.broker.transaction import Outcome, TransactionSettings
from tidemq.broker.transaction.records import committed_message
from tidemq.broker.transaction.service import wall_clock_ms
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
)
from tidemq.protocol.message import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_TRANSACTION_ID,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    decode_record,
    decode_records,
    encode_properties,
)
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.remoting.client import RemotingClient
from tidemq.store.interface import PutStatus

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TOPIC = "Orders"
GROUP = "order-tx"
WAIT_BOUND_S = 10.0
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


def half_request(body: bytes = b"order-1", *, queue_id: int = 2, group: str = GROUP,
                 properties: dict[str, str] | None = None, sys_flag: int = 4
                 ) -> RemotingCommand:
    props = {"TAGS": "paid", "KEYS": "o-1", "TRAN_MSG": "true", "PGROUP": group,
             **(properties or {})}
    header = SendMessageRequestHeader(
        producer_group=group, topic=TOPIC, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=queue_id, sys_flag=sys_flag, born_timestamp=wall_clock_ms(), flag=0,
        properties=encode_properties(props),
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(), body)


@dataclasses.dataclass
class Half:
    """What the producer learns from the half's SEND response."""

    queue_offset: int
    commit_log_offset: int
    msg_id: str
    queue_id: int

    def end(self, kind: int, *, group: str = GROUP, from_check: bool = False,
            oneway: bool = False) -> RemotingCommand:
        header = EndTransactionRequestHeader(
            producer_group=group, tran_state_table_offset=self.queue_offset,
            commit_log_offset=self.commit_log_offset, commit_or_rollback=kind,
            from_transaction_check=from_check, msg_id=self.msg_id, transaction_id=self.msg_id,
        )
        return RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext_fields(),
                                       oneway=oneway)


def half_of(response: RemotingCommand) -> Half:
    assert response.code == ResponseCode.SUCCESS, response.remark
    ext = response.ext_fields
    _, commit_log_offset = decode_offset_msg_id(ext["msgId"])
    return Half(int(ext["queueOffset"]), commit_log_offset, ext["msgId"], int(ext["queueId"]))


def stored(broker, topic: str, queue_id: int = 0):
    result = broker.store.get_messages(topic, queue_id, 0, 64, 16 * 1024 * 1024)
    return decode_records(result.body)


def stored_anywhere(broker, topic: str):
    return [m for queue_id in range(8) for m in stored(broker, topic, queue_id)]


def run(coro):
    async def bounded():
        async with asyncio.timeout(WAIT_BOUND_S * 3):
            return await coro
    return asyncio.run(bounded())


def later(broker, ms: int) -> None:
    """Move the transaction service's clock ``ms`` past the wall clock."""
    broker.transaction_service.clock_ms = lambda: wall_clock_ms() + ms


# -- halves and their end ------------------------------------------------------------------


def test_a_half_is_stored_in_the_half_topic_and_no_consumer_queue_sees_it(broker, handlers):
    table = handlers(broker)
    response = run(table.ask(half_request(queue_id=2)))
    half = half_of(response)

    assert half.queue_id == 2  # the producer's queue, as RocketMQ answers
    record = decode_record(broker.store.read_message(half.commit_log_offset))
    assert record.topic == HALF_TOPIC and record.queue_id == 0
    assert record.queue_offset == half.queue_offset
    assert record.properties["REAL_TOPIC"] == TOPIC and record.properties["REAL_QID"] == "2"
    assert record.transaction_type == TRANSACTION_NOT_TYPE
    assert stored_anywhere(broker, TOPIC) == []
    assert HALF_TOPIC in broker.topic_config_manager.all()


def test_commit_stores_the_message_once_in_its_topic_and_queue(broker, handlers):
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request(b"pay 42", queue_id=1)))
        first = await table.ask(half.end(COMMIT))
        again = await table.ask(half.end(COMMIT))
        contradiction = await table.ask(half.end(ROLLBACK))
        return half, first, again, contradiction

    half, first, again, contradiction = run(scenario())
    assert first.code == ResponseCode.SUCCESS
    assert again.code == ResponseCode.SUCCESS and "already committed" in again.remark
    assert contradiction.code == ResponseCode.SYSTEM_ERROR
    assert "already committed" in contradiction.remark

    [message] = stored_anywhere(broker, TOPIC)
    assert message.queue_id == 1 and message.body == b"pay 42"
    assert message.transaction_type == TRANSACTION_COMMIT_TYPE
    assert message.prepared_transaction_offset == half.commit_log_offset
    assert message.tags == "paid" and message.keys == ["o-1"]
    for gone in ("REAL_TOPIC", "REAL_QID", "TRAN_MSG"):
        assert gone not in message.properties
    [op] = stored(broker, OP_TOPIC)
    assert op.body == str(half.queue_offset).encode() and op.tags == "d"
    assert broker.transaction_service.outcome(half.queue_offset) == (True, Outcome.COMMIT)


def test_many_ends_at_once_commit_each_message_once_and_record_every_end(broker, handlers):
    table = handlers(broker)

    async def scenario():
        halves = [half_of(await table.ask(half_request(f"m{n}".encode(), queue_id=n % 4)))
                  for n in range(40)]
        kinds = [COMMIT if n % 3 else ROLLBACK for n in range(40)]
        # All arrive in one turn of the loop, each also twice: they are written together.
        ends = [half.end(kind) for half, kind in zip(halves, kinds, strict=True)]
        answers = await asyncio.gather(*(table.ask(end) for end in ends + ends))
        return halves, kinds, answers

    halves, kinds, answers = run(scenario())
    assert {answer.code for answer in answers} == {ResponseCode.SUCCESS}
    committed = sorted(m.body for m in stored_anywhere(broker, TOPIC))
    assert committed == sorted(f"m{n}".encode() for n in range(40) if kinds[n] == COMMIT)
    ended = {int(offset) for op in stored(broker, OP_TOPIC) for offset in op.body.split(b",")}
    assert ended == {half.queue_offset for half in halves}
    assert len(stored(broker, OP_TOPIC)) < 40  # batched, not one op record per end
    service = broker.transaction_service
    for half, kind in zip(halves, kinds, strict=True):
        expected = Outcome.COMMIT if kind == COMMIT else Outcome.ROLLBACK
        assert service.outcome(half.queue_offset) == (True, expected)


def test_rollback_stores_nothing_and_a_later_commit_is_refused(broker, handlers):
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request()))
        return (await table.ask(half.end(ROLLBACK)), await table.ask(half.end(COMMIT)))

    rollback, commit = run(scenario())
    assert rollback.code == ResponseCode.SUCCESS
    assert commit.code == ResponseCode.SYSTEM_ERROR and "rolled back" in commit.remark
    assert stored_anywhere(broker, TOPIC) == []
    assert len(stored(broker, OP_TOPIC)) == 1


def test_an_unknown_end_gets_no_answer_and_the_half_stays_pending(broker, handlers):
    table = handlers(broker)

    # END_TRANSACTION with "unknown" is left unanswered, as RocketMQ does.
    async def scenario_unknown():
        half = half_of(await table.ask(half_request()))
        handler = table.handlers[RequestCode.END_TRANSACTION]
        return half, await handler(half.end(UNKNOWN), _Peer())

    half, answer = run(scenario_unknown())
    assert answer is None
    assert broker.transaction_service.outcome(half.queue_offset) == (False, None)
    assert stored(broker, OP_TOPIC) == []


class _Peer:
    remote_address = "127.0.0.1:40001"
    attributes: dict = {}
    on_close: list = []
    is_closing = False


@pytest.mark.parametrize(
    ("change", "remark"),
    [
        ({"group": "someone-else"}, "The producer group wrong"),
        ({"queue_offset": 7}, "The transaction state table offset wrong"),
        ({"commit_log_offset": 3}, "Find prepared transaction message failed"),
    ],
)
def test_an_end_that_does_not_match_its_half_is_refused(broker, handlers, change, remark):
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request()))
        group = change.get("group", GROUP)
        wrong = dataclasses.replace(half, **{k: v for k, v in change.items() if k != "group"})
        return await table.ask(wrong.end(COMMIT, group=group))

    response = run(scenario())
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark.startswith(remark)
    assert stored_anywhere(broker, TOPIC) == []


def test_an_end_naming_a_plain_message_is_refused(broker, handlers):
    table = handlers(broker)
    plain = half_request(properties={"TRAN_MSG": "false"}, sys_flag=0)

    async def scenario():
        response = await table.ask(plain)
        assert response.code == ResponseCode.SUCCESS
        not_half = half_of(response)
        return await table.ask(not_half.end(COMMIT))

    response = run(scenario())
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "not a half message" in response.remark
    assert len(stored_anywhere(broker, TOPIC)) == 1  # the plain message, not a second copy


def test_a_malformed_end_is_refused_naming_the_problem(broker, handlers):
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request()))
        missing = half.end(COMMIT)
        del missing.ext_fields["commitLogOffset"]
        strange = half.end(4)  # PREPARED is no way to end a transaction
        return await table.ask(missing), await table.ask(strange)

    missing, strange = run(scenario())
    assert missing.code == ResponseCode.SYSTEM_ERROR and "commitLogOffset" in missing.remark
    assert strange.code == ResponseCode.SYSTEM_ERROR and "commitOrRollback is 4" in strange.remark
    assert stored_anywhere(broker, TOPIC) == []


def test_a_slave_refuses_end_transaction(make_broker, handlers):
    slave = make_broker(broker_role="SLAVE", broker_id=1)
    half = Half(0, 0, "00" * 16, 0)
    response = run(handlers(slave).ask(half.end(COMMIT)))
    assert response.code == ResponseCode.SLAVE_NOT_AVAILABLE


def test_a_committed_message_with_a_delay_level_waits_in_the_schedule_topic(broker, handlers):
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request(properties={"DELAY": "3"})))
        return await table.ask(half.end(COMMIT))

    assert run(scenario()).code == ResponseCode.SUCCESS
    assert stored_anywhere(broker, TOPIC) == []
    [delayed] = stored(broker, "SCHEDULE_TOPIC_XXXX", 2)
    assert delayed.properties["REAL_TOPIC"] == TOPIC
    assert delayed.transaction_type == TRANSACTION_COMMIT_TYPE


# -- checks over loopback --------------------------------------------------------------------


class FakeProducer:
    """A RemotingClient announcing a producer group, recording the checks it gets."""

    def __init__(self, address: str, group: str = GROUP) -> None:
        self.address = address
        self.group = group
        self.client = RemotingClient()
        self.checks: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.client.register(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)

    async def _on_check(self, request, connection):
        await self.checks.put(request)
        return None

    async def join(self) -> None:
        body = jsonx.dumps({"clientID": f"127.0.0.1@{self.group}", "consumerDataSet": [],
                            "producerDataSet": [{"groupName": self.group}]})
        request = RemotingCommand.request(RequestCode.HEART_BEAT, None, body)
        response = await self.client.invoke(self.address, request, 5000)
        assert response.code == ResponseCode.SUCCESS

    async def send(self, request: RemotingCommand) -> RemotingCommand:
        return await self.client.invoke(self.address, request, 5000)

    async def next_check(self) -> RemotingCommand:
        return await asyncio.wait_for(self.checks.get(), WAIT_BOUND_S)

    async def answer(self, check: RemotingCommand, kind: int) -> None:
        header = CheckTransactionStateRequestHeader.from_ext_fields(check.ext_fields)
        end = EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset, commit_or_rollback=kind,
            from_transaction_check=True, msg_id=header.msg_id or "",
            transaction_id=header.transaction_id,
        )
        request = RemotingCommand.request(RequestCode.END_TRANSACTION, end.to_ext_fields(),
                                          oneway=True)
        await self.client.invoke_oneway(self.address, request)


async def wait_for(condition, what: str) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.02)
    assert condition(), what


@pytest.mark.parametrize(("answer", "expected_count"), [(COMMIT, 1), (ROLLBACK, 0)])
def test_an_unknown_half_is_checked_and_the_answer_ends_it(broker, serve, answer,
                                                            expected_count):
    async def scenario():
        async with serve(broker) as link:
            producer = FakeProducer(link.address)
            try:
                await producer.join()
                half = half_of(await producer.send(half_request(b"maybe", queue_id=3)))
                await producer.client.invoke_oneway(link.address, half.end(UNKNOWN, oneway=True))
                assert producer.checks.empty()
                later(broker, broker.transaction_service.settings.timeout_ms + 1_000)
                await broker.transaction_service.tick()  # or wait for the broker's own tick
                check = await producer.next_check()
                await producer.answer(check, answer)
                # The half is marked ended when its end is queued; its committed copy is
                # written by the end writer's callback after that (end_writer.py): wait
                # for both, or the store may be read in between.
                service = broker.transaction_service
                await wait_for(lambda: service.outcome(half.queue_offset)[0]
                               and service.writer.queued_answer(half.queue_offset) is None,
                               "the half to end and its records to be written")
                return half, check, stored_anywhere(broker, TOPIC)
            finally:
                await producer.client.close()

    half, check, messages = run(scenario())
    header = CheckTransactionStateRequestHeader.from_ext_fields(check.ext_fields)
    assert check.is_oneway
    assert header.tran_state_table_offset == half.queue_offset
    assert header.commit_log_offset == half.commit_log_offset
    assert header.offset_msg_id == half.msg_id
    message = decode_record(check.body)
    assert (message.topic, message.queue_id, message.body) == (TOPIC, 3, b"maybe")
    assert message.properties["PGROUP"] == GROUP
    assert len(messages) == expected_count
    if expected_count:
        assert messages[0].queue_id == 3 and messages[0].body == b"maybe"


def test_a_half_is_not_checked_before_its_immunity_time(broker, serve):
    async def scenario():
        async with serve(broker) as link:
            producer = FakeProducer(link.address)
            try:
                await producer.join()
                immune = {PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "30"}
                half_of(await producer.send(half_request(properties=immune)))
                service = broker.transaction_service
                later(broker, 20_000)  # past transactionTimeOut, within the 30 s immunity
                await service.tick()
                await service.tick()
                early = producer.checks.qsize()
                later(broker, 31_000)
                await service.tick()
                await producer.next_check()
                return early
            finally:
                await producer.client.close()

    assert run(scenario()) == 0


def test_a_half_nobody_answers_is_discarded_after_the_last_check(broker, serve, handlers):
    broker.transaction_service.settings = TransactionSettings(
        timeout_ms=1_000, check_interval_ms=10_000, check_max=3
    )

    async def scenario():
        async with serve(broker) as link:
            producer = FakeProducer(link.address)
            try:
                await producer.join()
                half = half_of(await producer.send(half_request(b"never answered")))
                service = broker.transaction_service
                for check_number in range(1, 4):
                    later(broker, 2_000 + (check_number - 1) * 10_000)
                    await service.tick()
                    check = await producer.next_check()
                    header = CheckTransactionStateRequestHeader.from_ext_fields(
                        check.ext_fields)
                    assert header.tran_state_table_offset == half.queue_offset
                later(broker, 2_000 + 3 * 10_000)
                await service.tick()
                await wait_for(lambda: broker.transaction_service.outcome(half.queue_offset)[0],
                               "the half to be discarded")
                late = await producer.send(half.end(COMMIT))
                return (half, late, producer.checks.qsize(), stored(broker, DISCARD_TOPIC),
                        stored_anywhere(broker, TOPIC))
            finally:
                await producer.client.close()

    half, late, extra_checks, discards, messages = run(scenario())
    assert extra_checks == 0  # exactly check_max checks were sent
    assert broker.transaction_service.outcome(half.queue_offset) == (True, Outcome.DISCARD)
    [discarded] = discards
    assert discarded.body == b"never answered"
    assert discarded.properties["REAL_TOPIC"] == TOPIC
    assert late.code == ResponseCode.SYSTEM_ERROR and "discarded" in late.remark
    assert messages == []


def test_checks_are_counted_and_the_half_discarded_with_no_producer_connected(broker, handlers):
    broker.transaction_service.settings = TransactionSettings(
        timeout_ms=1_000, check_interval_ms=1_000, check_max=2
    )
    table = handlers(broker)

    async def scenario():
        half = half_of(await table.ask(half_request()))
        service = broker.transaction_service
        for step in range(4):
            later(broker, 2_000 + step * 1_000)
            await service.tick()
        return half

    half = run(scenario())
    assert broker.transaction_service.outcome(half.queue_offset) == (True, Outcome.DISCARD)
    assert len(stored(broker, DISCARD_TOPIC)) == 1


# -- transaction ids ---------------------------------------------------------------------------


def test_a_pending_half_is_found_by_group_and_producer_chosen_transaction_id(broker, handlers):
    table = handlers(broker)

    async def scenario():
        half_of(await table.ask(half_request(b"a", properties={PROPERTY_TRANSACTION_ID: "e-1"})))
        wanted = half_of(await table.ask(
            half_request(b"b", properties={PROPERTY_TRANSACTION_ID: "e-2"})))
        service = broker.transaction_service
        unscanned = service.find_half(GROUP, "e-2")  # too young for the scan
        later(broker, 5_000)
        await service.tick()
        scanned = service.find_half(GROUP, "e-2")
        return wanted, unscanned, scanned, service.find_half("other-group", "e-2")

    wanted, unscanned, scanned, other = run(scenario())
    for found in (unscanned, scanned):
        assert found.queue_offset == wanted.queue_offset
        assert found.physical_offset == wanted.commit_log_offset
        assert found.transaction_id == "e-2" and found.producer_group == GROUP
    assert other is None


# -- restarts ----------------------------------------------------------------------------------


def test_ended_and_pending_halves_survive_a_restart(make_broker, handlers, tmp_path):
    root = tmp_path / "store"
    broker = make_broker(store_kind="file", root=root)
    broker.transaction_service.settings = TransactionSettings(check_max=5)
    table = handlers(broker)

    async def before():
        await broker.start()
        committed = half_of(await table.ask(half_request(b"committed")))
        await table.ask(committed.end(COMMIT))
        open_half = half_of(await table.ask(half_request(b"open")))
        later(broker, 10_000)
        await broker.transaction_service.tick()  # checked once (nobody is connected)
        check_times = broker.transaction_service.progress.pending[open_half.queue_offset]
        await broker.shutdown(grace_s=1.0)
        return committed, open_half, check_times.check_times

    committed, open_half, check_times = run(before())
    assert check_times == 1
    broker = make_broker(store_kind="file", root=root)
    table = handlers(broker)

    async def after():
        await broker.transaction_service.ready()
        progress = broker.transaction_service.progress
        restored_check_times = progress.pending[open_half.queue_offset].check_times
        again = await table.ask(committed.end(COMMIT))
        late_commit = await table.ask(open_half.end(COMMIT))
        return restored_check_times, again, late_commit

    restored_check_times, again, late_commit = run(after())
    assert restored_check_times == 1
    assert again.code == ResponseCode.SUCCESS and "already committed" in again.remark
    assert late_commit.code == ResponseCode.SUCCESS
    bodies = sorted(m.body for m in stored_anywhere(broker, TOPIC))
    assert bodies == [b"committed", b"open"]


def test_a_commit_whose_op_record_was_lost_is_not_stored_twice(make_broker, handlers, tmp_path):
    root = tmp_path / "store"
    broker = make_broker(store_kind="file", root=root)
    table = handlers(broker)

    async def before():
        return half_of(await table.ask(half_request(b"once")))

    half = run(before())
    # The crash window: the committed copy is stored, the op record is not.
    record = decode_record(broker.store.read_message(half.commit_log_offset))
    assert broker.store.put_message(committed_message(record)).ok
    run(broker.shutdown(grace_s=1.0))
    broker = make_broker(store_kind="file", root=root)
    table = handlers(broker)

    async def after():
        return await table.ask(half.end(COMMIT))

    response = run(after())
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in stored_anywhere(broker, TOPIC)] == [b"once"]
    assert broker.transaction_service.outcome(half.queue_offset) == (True, Outcome.COMMIT)


def test_the_scan_ends_a_half_committed_before_a_crash_without_asking(make_broker, tmp_path):
    root = tmp_path / "store"
    broker = make_broker(store_kind="file", root=root)
    result = broker.store.put_message(broker.transaction_service.prepare(
        _store_message(b"lost op")))
    half = decode_record(broker.store.read_message(result.physical_offset))
    assert broker.store.put_message(committed_message(half)).ok
    run(broker.shutdown(grace_s=1.0))
    broker = make_broker(store_kind="file", root=root)
    later(broker, 120_000)
    run(broker.transaction_service.tick())

    assert broker.transaction_service.outcome(half.queue_offset) == (True, Outcome.COMMIT)
    assert broker.transaction_service.progress.pending == {}
    assert [m.body for m in stored_anywhere(broker, TOPIC)] == [b"lost op"]


def _store_message(body: bytes):
    from tidemq.store.interface import StoreMessage

    return StoreMessage(TOPIC, 0, body, {"TRAN_MSG": "true", "PGROUP": GROUP,
                                         "UNIQ_KEY": "AC1100010000000000000000000000A1"})


def test_end_transactions_of_one_read_are_answered_each_and_committed_together(broker, handlers):
    table = handlers(broker)
    processor = broker.transaction_service.end_processor

    async def scenario():
        halves = [half_of(await table.ask(half_request(body, queue_id=queue)))
                  for body, queue in ((b"a", 1), (b"b", 2), (b"c", 1))]
        requests = [halves[0].end(COMMIT), halves[1].end(COMMIT, oneway=True),
                    halves[2].end(ROLLBACK)]
        responses = await processor.handle_group(requests, _Peer())
        await asyncio.sleep(0)  # the oneway end's write
        return responses

    responses = run(scenario())
    assert [r.code if r is not None else None for r in responses] == [
        ResponseCode.SUCCESS, ResponseCode.SUCCESS, ResponseCode.SUCCESS]
    assert sorted(m.body for m in stored_anywhere(broker, TOPIC)) == [b"a", b"b"]


def test_commits_on_a_sync_master_wait_once_per_flush_and_say_when_no_slave_confirmed(
        broker, handlers, monkeypatch):
    """SYNC_MASTER (end_writer.py, *Durability*): the commits written together share one
    wait; a commit no slave confirmed stands but is answered SLAVE_NOT_AVAILABLE, a rollback
    at once; once a slave confirms, commits are answered SUCCESS."""
    table = handlers(broker)
    service = broker.transaction_service
    asked: list[int] = []  # the end offset each wait covers
    verdict = {"status": PutStatus.SLAVE_NOT_AVAILABLE}

    async def stored_status(result):
        asked.append(result.physical_offset + result.wrote_bytes)
        await asyncio.sleep(0)
        return verdict["status"]

    monkeypatch.setattr(type(service), "waits_for_slaves", property(lambda _self: True))
    monkeypatch.setattr(service, "stored_status", stored_status)

    async def scenario(prefix: str, count: int):
        halves = [half_of(await table.ask(half_request(f"{prefix}{n}".encode(),
                                                        queue_id=n % 4)))
                  for n in range(count)]
        kinds = [ROLLBACK if n % 5 == 0 else COMMIT for n in range(count)]
        answers = await asyncio.gather(*(table.ask(half.end(kind))
                                         for half, kind in zip(halves, kinds, strict=True)))
        return halves, kinds, answers

    halves, kinds, answers = run(scenario("a", 30))
    for kind, answer in zip(kinds, answers, strict=True):
        if kind == ROLLBACK:
            assert answer.code == ResponseCode.SUCCESS
        else:
            assert answer.code == ResponseCode.SLAVE_NOT_AVAILABLE
            assert "stored on this master and the half is ended" in answer.remark
    assert 1 <= len(asked) < 24  # one wait per flush, not one per commit
    assert asked[-1] == broker.store.commit_log_max_offset()  # the op record's end
    committed = sorted(m.body for m in stored_anywhere(broker, TOPIC))
    assert committed == sorted(f"a{n}".encode() for n in range(30) if kinds[n] == COMMIT)
    for half, kind in zip(halves, kinds, strict=True):  # ended on the master all the same
        expected = Outcome.COMMIT if kind == COMMIT else Outcome.ROLLBACK
        assert service.outcome(half.queue_offset) == (True, expected)

    verdict["status"] = PutStatus.PUT_OK
    _, _, answers = run(scenario("b", 10))
    assert {answer.code for answer in answers} == {ResponseCode.SUCCESS}
