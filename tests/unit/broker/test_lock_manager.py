"""Orderly consumers' queue locks: LOCK_BATCH_MQ / UNLOCK_BATCH_MQ with a 60 s lease."""

from __future__ import annotations

import asyncio

import orjson

from tidemq.broker.lock_manager import (
    REBALANCE_LOCK_LEASE_MS,
    LockBatchProcessor,
    MessageQueue,
    RebalanceLockManager,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

Q0 = MessageQueue("TopicOrd", "broker-a", 0)
Q1 = MessageQueue("TopicOrd", "broker-a", 1)
Q2 = MessageQueue("TopicOrd", "broker-a", 2)


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


class Peer:
    """The parts of a Connection the lock processor uses; ``close()`` runs its callbacks."""

    def __init__(self, remote_address: str = "127.0.0.1:40001") -> None:
        self.remote_address = remote_address
        self.attributes: dict[str, object] = {}
        self.on_close: list = []

    def close(self) -> None:
        for callback in self.on_close:
            callback(self)


def _manager() -> tuple[RebalanceLockManager, FakeClock]:
    clock = FakeClock()
    return RebalanceLockManager(clock_ms=clock), clock


def test_free_queues_are_granted_and_held_queues_refused_to_others():
    locks, _ = _manager()
    assert locks.try_lock_batch("g", [Q0, Q1], "client-a") == [Q0, Q1]
    assert locks.try_lock_batch("g", [Q1, Q2], "client-b") == [Q2]
    assert locks.holder("g", Q1) == "client-a"
    assert locks.is_locked_by("g", Q2, "client-b")


def test_locks_are_per_group():
    locks, _ = _manager()
    locks.try_lock_batch("g1", [Q0], "client-a")
    assert locks.try_lock_batch("g2", [Q0], "client-b") == [Q0]


def test_lease_expires_after_60_s_and_another_client_takes_the_queue():
    locks, clock = _manager()
    locks.try_lock_batch("g", [Q0], "client-a")
    clock.now_ms += REBALANCE_LOCK_LEASE_MS
    assert locks.try_lock_batch("g", [Q0], "client-b") == []  # exactly 60 s: still held
    clock.now_ms += 1
    assert locks.holder("g", Q0) is None
    assert locks.try_lock_batch("g", [Q0], "client-b") == [Q0]
    assert locks.holder("g", Q0) == "client-b"


def test_run_out_leases_are_purged_and_live_ones_kept():
    locks, clock = _manager()
    locks.try_lock_batch("g", [Q0], "client-a")
    clock.now_ms += 30_000
    locks.try_lock_batch("g", [Q1], "client-b")
    clock.now_ms += 40_000  # Q0's lease ran out 10 s ago, Q1's has 20 s left
    assert locks.purge_expired() == 1
    assert locks.holder("g", Q1) == "client-b"
    assert locks.try_lock_batch("g", [Q0], "client-c") == [Q0]


def test_holder_renews_its_lease_by_locking_again():
    locks, clock = _manager()
    locks.try_lock_batch("g", [Q0], "client-a")
    clock.now_ms += 40_000
    assert locks.try_lock_batch("g", [Q0], "client-a") == [Q0]
    clock.now_ms += 40_000  # 80 s after the first lock, 40 s after the renewal
    assert locks.try_lock_batch("g", [Q0], "client-b") == []
    assert locks.holder("g", Q0) == "client-a"


def test_unlock_releases_only_the_callers_locks():
    locks, _ = _manager()
    locks.try_lock_batch("g", [Q0], "client-a")
    locks.try_lock_batch("g", [Q1], "client-b")
    locks.unlock_batch("g", [Q0, Q1], "client-a")
    assert locks.holder("g", Q0) is None
    assert locks.holder("g", Q1) == "client-b"
    assert locks.try_lock_batch("g", [Q0], "client-b") == [Q0]


# -- the processor, with the bodies a real C++ orderly consumer sends (oracle frames) ----------

CPP_LOCK_BODY = (
    b'{"clientId":"26101-127.0.0.1@DEFAULT","consumerGroup":"cg_capture",'
    b'"mqSet":[{"brokerName":"broker-a","queueId":0,"topic":"TopicOrd"}]}\n'
)
CPP_UNLOCK_BODY = (
    b'{"clientId":"26101-127.0.0.1@DEFAULT","consumerGroup":"cg_capture","mqSet":['
    b'{"brokerName":"broker-a","queueId":0,"topic":"TopicOrd"},'
    b'{"brokerName":"broker-a","queueId":2,"topic":"TopicOrd"}]}\n'
)


def _call(handler, body: bytes | None, peer: Peer | None = None) -> RemotingCommand:
    request = RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=body)
    response = asyncio.run(handler(request, peer or Peer()))
    assert response.opaque == request.opaque
    return response


def _lock_body(client_id: str, queues: list[MessageQueue]) -> bytes:
    return orjson.dumps({
        "clientId": client_id,
        "consumerGroup": "cg_capture",
        "mqSet": [q.to_json() for q in queues],
    })


def test_lock_batch_answers_the_queues_locked():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    response = _call(processor.lock_batch, CPP_LOCK_BODY)
    assert response.code == ResponseCode.SUCCESS
    assert orjson.loads(response.body) == {
        "lockOKMQSet": [{"brokerName": "broker-a", "queueId": 0, "topic": "TopicOrd"}]
    }
    other = _call(processor.lock_batch, _lock_body("other@1", [Q0, Q1]))
    assert orjson.loads(other.body) == {"lockOKMQSet": [Q1.to_json()]}


def test_unlock_batch_frees_the_queues_for_others():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    _call(processor.lock_batch, CPP_LOCK_BODY)
    response = _call(processor.unlock_batch, CPP_UNLOCK_BODY)
    assert response.code == ResponseCode.SUCCESS
    other = _call(processor.lock_batch, _lock_body("other@1", [Q0]))
    assert orjson.loads(other.body) == {"lockOKMQSet": [Q0.to_json()]}


def test_lock_batch_with_string_queue_ids_still_locks():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    body = (b'{"clientId":"c","consumerGroup":"g","mqSet":'
            b'[{"brokerName":"broker-a","queueId":"3","topic":"T"}]}')
    response = _call(processor.lock_batch, body)
    assert orjson.loads(response.body)["lockOKMQSet"] == [
        {"brokerName": "broker-a", "queueId": 3, "topic": "T"}
    ]


def test_malformed_lock_bodies_get_system_error_naming_the_problem():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    cases = {
        None: "no body",
        b"not json": "LOCK_BATCH_MQ",
        b"[1,2]": "not a JSON object",
        b'{"consumerGroup":"g","mqSet":[]}': "clientId",
        b'{"clientId":"c","mqSet":[]}': "consumerGroup",
        b'{"clientId":"c","consumerGroup":"g","mqSet":[{"topic":"T"}]}': "brokerName",
        b'{"clientId":"c","consumerGroup":"g","mqSet":{"a":1}}': "mqSet",
    }
    for body, expected in cases.items():
        response = _call(processor.lock_batch, body)
        assert response.code == ResponseCode.SYSTEM_ERROR, body
        assert expected in response.remark, (body, response.remark)


def test_broker_serves_lock_and_unlock_requests(broker, handlers):
    table = handlers(broker)
    request = RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=CPP_LOCK_BODY)
    response = asyncio.run(table.ask(request))
    assert response.code == ResponseCode.SUCCESS
    assert orjson.loads(response.body)["lockOKMQSet"] == [Q0.to_json()]
    assert broker.lock_manager.holder("cg_capture", Q0) == "26101-127.0.0.1@DEFAULT"
    request = RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=CPP_UNLOCK_BODY)
    assert asyncio.run(table.ask(request)).code == ResponseCode.SUCCESS
    assert broker.lock_manager.holder("cg_capture", Q0) is None


def test_closing_the_holders_connection_frees_its_queues_at_once():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    holder, other = Peer("127.0.0.1:40001"), Peer("127.0.0.1:40002")
    _call(processor.lock_batch, _lock_body("holder@1", [Q0, Q1]), holder)
    _call(processor.lock_batch, _lock_body("other@1", [Q2]), other)
    refused = _call(processor.lock_batch, _lock_body("other@1", [Q0, Q1]), other)
    assert orjson.loads(refused.body) == {"lockOKMQSet": []}
    holder.close()
    granted = _call(processor.lock_batch, _lock_body("other@1", [Q0, Q1]), other)
    assert orjson.loads(granted.body) == {"lockOKMQSet": [Q0.to_json(), Q1.to_json()]}
    assert locks.holder("cg_capture", Q2) == "other@1"  # the survivor's own lock is kept


def test_a_holder_that_relocked_on_a_new_connection_keeps_its_queues_when_the_old_closes():
    locks, _ = _manager()
    processor = LockBatchProcessor(locks)
    old, new = Peer("127.0.0.1:40001"), Peer("127.0.0.1:40003")
    _call(processor.lock_batch, _lock_body("holder@1", [Q0]), old)
    _call(processor.lock_batch, _lock_body("holder@1", [Q0]), new)
    old.close()
    assert locks.holder("cg_capture", Q0) == "holder@1"
    new.close()
    assert locks.holder("cg_capture", Q0) is None


def test_release_owner_ends_only_that_owners_leases():
    locks, _ = _manager()
    locks.try_lock_batch("g", [Q0], "client-a", owner="conn-a")
    locks.try_lock_batch("g2", [Q1], "client-a", owner="conn-a")
    locks.try_lock_batch("g", [Q2], "client-b", owner="conn-b")
    assert sorted(locks.release_owner("conn-a")) == [("g", Q0, "client-a"),
                                                     ("g2", Q1, "client-a")]
    assert locks.holder("g", Q0) is None and locks.holder("g", Q2) == "client-b"
    assert locks.release_owner("conn-a") == []
