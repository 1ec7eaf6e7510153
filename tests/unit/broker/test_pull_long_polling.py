"""Long polling: a suspended pull is answered when a message arrives, or at its timeout.

Every test runs a real broker on loopback (``serve``) and pulls through a RemotingClient. The
tests assert the order of events (parked, then a message, then the answer), never how long
anything took; every wait is bounded so a broken broker fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.broker.config import PERM_WRITE
from tidemq.broker.metrics import BrokerCollector
from tidemq.broker.pull_processor import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    WAKE_SKIPPED_ENTRIES_MAX,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import SendMessageRequestHeader
from tidemq.protocol.message import BatchEntry, encode_batch_body, iter_records
from tidemq.remoting.client import RemotingClient
from tidemq.store.config_tables import SubscriptionGroupConfig, TopicConfig
from tidemq.store.interface import StoreMessage

TOPIC = "TopicPoll"
GROUP = "cg_poll"
WAIT_BOUND_S = 10.0
SUSPEND_FLAGS = PULL_FLAG_SUBSCRIPTION | PULL_FLAG_SUSPEND


def message(tags: str | None = None, body: bytes = b"payload", queue_id: int = 0
            ) -> StoreMessage:
    return StoreMessage(
        TOPIC, queue_id, body, {"TAGS": tags} if tags else {},
        born_timestamp=int(time.time() * 1000), born_host="127.0.0.1:50000",
    )


def pull_request(offset: int, *, suspend_ms: int, subscription: str = "*",
                 flags: int = SUSPEND_FLAGS, queue_id: int = 0) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": str(queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": str(flags), "commitOffset": "0",
        "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0",
        "subscription": subscription,
    })


async def wait_until(condition, what: str) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.005)
    assert condition(), what


def start_pull(link, request: RemotingCommand) -> asyncio.Task[RemotingCommand]:
    return asyncio.get_running_loop().create_task(link.invoke(request, timeout_ms=30_000))


def broker_with_topic(make_broker, **overrides):
    broker = make_broker(**overrides)
    broker.topic_config_manager.update(TopicConfig(TOPIC, 1, 1))
    return broker


def test_parked_pull_is_answered_when_a_message_is_dispatched(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            broker.store.put_message(message(body=b"old"))
            pending = start_pull(link, pull_request(1, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            assert not pending.done()
            broker.store.put_message(message(body=b"new"))
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_records(response.body)] == [b"new"]
            assert response.ext_fields["nextBeginOffset"] == "2"
            assert hold.parked_count == 0

    asyncio.run(main())


@pytest.mark.parametrize("change", ["topic_write_only", "group_consume_disabled"])
def test_a_permission_taken_away_while_a_pull_is_parked_answers_it_no_permission(
        make_broker, serve, change):
    # A woken pull is checked again as it is re-run: what changed while it waited (an admin
    # took the topic's read permission, or the group's consumeEnable) is what it is told,
    # not the message that woke it.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service
    broker.subscription_group_manager.update_subscription_group_config(
        SubscriptionGroupConfig(GROUP))

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            if change == "topic_write_only":
                broker.topic_config_manager.update(TopicConfig(TOPIC, 1, 1, perm=PERM_WRITE))
            else:
                broker.subscription_group_manager.update_subscription_group_config(
                    SubscriptionGroupConfig(GROUP, consume_enable=False))
            broker.store.put_message(message(body=b"not for you"))
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.NO_PERMISSION, response.remark
            assert not response.body
            assert hold.parked_count == 0

    asyncio.run(main())


def test_pulls_of_two_groups_woken_together_are_each_checked_for_their_own_group(
        make_broker, serve):
    # One wake pass re-runs both; what passed the checks for one group is not the other's.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service
    for group in (GROUP, "cg_poll_other"):
        broker.subscription_group_manager.update_subscription_group_config(
            SubscriptionGroupConfig(group))

    async def main():
        async with serve(broker) as link:
            other = pull_request(0, suspend_ms=60_000)
            other.ext_fields["consumerGroup"] = "cg_poll_other"
            pending = [start_pull(link, pull_request(0, suspend_ms=60_000)),
                       start_pull(link, other)]
            await wait_until(lambda: hold.parked_count == 2, "both pulls parked")
            broker.subscription_group_manager.update_subscription_group_config(
                SubscriptionGroupConfig("cg_poll_other", consume_enable=False))
            broker.store.put_message(message(body=b"for one of them"))
            async with asyncio.timeout(WAIT_BOUND_S):
                mine, theirs = await asyncio.gather(*pending)
            assert mine.code == ResponseCode.SUCCESS, mine.remark
            assert theirs.code == ResponseCode.NO_PERMISSION, theirs.remark
            assert "cg_poll_other" in theirs.remark

    asyncio.run(main())


def test_parked_pull_is_answered_not_found_at_its_timeout(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            broker.store.put_message(message())
            pending = start_pull(link, pull_request(1, suspend_ms=50))
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.PULL_NOT_FOUND
            assert {k: response.ext_fields[k] for k in ("nextBeginOffset", "maxOffset")} == {
                "nextBeginOffset": "1", "maxOffset": "1",
            }
            assert not response.body
            assert hold.parked_count == 0

    asyncio.run(main())


def test_parked_pulls_end_at_their_own_timeouts_with_shared_deadline_timers(make_broker,
                                                                           serve):
    # Deadlines share timers by slot (pull_hold_service.py): pulls in one slot both end at
    # its end, a long one parked beside them still waits, and a woken pull is answered by
    # its message.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            broker.store.put_message(message())
            woken = start_pull(link, pull_request(1, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the first pull parked")
            broker.store.put_message(message(body=b"new"))
            async with asyncio.timeout(WAIT_BOUND_S):
                first = await woken
            short = start_pull(link, pull_request(2, suspend_ms=30))
            same_slot = start_pull(link, pull_request(2, suspend_ms=31))
            long = start_pull(link, pull_request(2, suspend_ms=60_000))
            async with asyncio.timeout(WAIT_BOUND_S):
                ended = [await short, await same_slot]
            assert not long.done() and hold.parked_count == 1
            broker.store.put_message(message(body=b"last"))
            async with asyncio.timeout(WAIT_BOUND_S):
                last = await long
            return first, ended, last

    first, ended, last = asyncio.run(main())
    assert first.code == ResponseCode.SUCCESS
    assert [m.body for m in iter_records(first.body)] == [b"new"]
    assert [response.code for response in ended] == [ResponseCode.PULL_NOT_FOUND] * 2
    assert [m.body for m in iter_records(last.body)] == [b"last"]
    assert hold.parked_count == 0


def test_short_polling_holds_for_short_polling_time_instead(make_broker, serve):
    broker = broker_with_topic(make_broker, long_polling_enable=False, short_polling_time_ms=20)

    async def main():
        async with serve(broker) as link:
            # The client asks for a minute; without long polling the broker holds 20 ms.
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await link.invoke(pull_request(0, suspend_ms=60_000), 30_000)
            assert response.code == ResponseCode.PULL_NOT_FOUND

    asyncio.run(main())


def test_pull_without_suspend_flag_is_answered_at_once(make_broker, serve):
    broker = broker_with_topic(make_broker)

    async def main():
        async with serve(broker) as link:
            response = await link.invoke(
                pull_request(0, suspend_ms=60_000, flags=PULL_FLAG_SUBSCRIPTION), 30_000
            )
            assert response.code == ResponseCode.PULL_NOT_FOUND
            assert broker.pull_hold_service.parked_count == 0

    asyncio.run(main())


def test_message_not_matching_the_filter_keeps_the_pull_parked(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000, subscription="TagA"))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            broker.store.put_message(message("TagB", b"not for us"))
            for _ in range(20):  # let the wake-up pass run, whatever it decides
                await asyncio.sleep(0)
            await asyncio.sleep(0.02)
            assert not pending.done()
            assert hold.parked_count == 1
            broker.store.put_message(message("TagA", b"ours"))
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_records(response.body)] == [b"ours"]
            assert response.ext_fields["nextBeginOffset"] == "2"

    asyncio.run(main())


def test_pile_of_non_matching_messages_moves_the_parked_consumer_past_it(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000, subscription="TagA"))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            batch = [message("TagB") for _ in range(WAKE_SKIPPED_ENTRIES_MAX)]
            assert broker.store.put_messages(batch).ok
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert response.ext_fields["nextBeginOffset"] == str(WAKE_SKIPPED_ENTRIES_MAX)

    asyncio.run(main())


def test_message_appended_from_another_thread_wakes_the_pull(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            result = await asyncio.to_thread(broker.store.put_message, message(body=b"threaded"))
            assert result.ok
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert response.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_records(response.body)] == [b"threaded"]

    asyncio.run(main())


def send_request(body: bytes) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="pg_poll", topic=TOPIC, default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=0, sys_flag=0,
        born_timestamp=int(time.time() * 1000), flag=0, properties="",
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_ext_fields(v2=True),
                                   body)


def test_woken_pull_is_answered_before_the_send_that_woke_it(make_broker, serve):
    # The end-to-end latency path (issue 18): the consumer's answer leaves as the message is
    # stored, not after the producer's acknowledgement. On one connection the wire order
    # shows it: the pull's response arrives first.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            arrived: list[str] = []
            pull = start_pull(link, pull_request(0, suspend_ms=60_000))
            pull.add_done_callback(lambda _: arrived.append("pull"))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            send = asyncio.get_running_loop().create_task(link.invoke(send_request(b"wakes it")))
            send.add_done_callback(lambda _: arrived.append("send"))
            async with asyncio.timeout(WAIT_BOUND_S):
                pulled, sent = await asyncio.gather(pull, send)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            assert pulled.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_records(pulled.body)] == [b"wakes it"]
            assert arrived == ["pull", "send"]

    asyncio.run(main())


def test_woken_pull_is_answered_before_the_batch_send_that_woke_it(make_broker, serve):
    # A batch send is appended at the end of its loop iteration with the others served in it
    # (broker/batch_appender.py); the pull it wakes is still answered before it.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service
    bodies = [b"first", b"second", b"third"]

    async def main():
        async with serve(broker) as link:
            arrived: list[str] = []
            pull = start_pull(link, pull_request(0, suspend_ms=60_000))
            pull.add_done_callback(lambda _: arrived.append("pull"))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            request = send_request(encode_batch_body([BatchEntry(body) for body in bodies]))
            request.code = RequestCode.SEND_BATCH_MESSAGE
            send = asyncio.get_running_loop().create_task(link.invoke(request))
            send.add_done_callback(lambda _: arrived.append("send"))
            async with asyncio.timeout(WAIT_BOUND_S):
                pulled, sent = await asyncio.gather(pull, send)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            assert len(sent.ext_fields["msgId"].split(",")) == len(bodies)
            assert pulled.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_records(pulled.body)] == bodies
            assert arrived == ["pull", "send"]

    asyncio.run(main())


def test_pulls_woken_on_several_queues_are_answered_in_one_write(make_broker, serve):
    # A producer's sends of one loop iteration arrive in one read and wake a consumer's
    # pulls of several queues in one pass: their answers leave in one write (one writev for
    # the broker, one wake-up for the consumer), not one per queue.
    broker = make_broker()
    broker.topic_config_manager.update(TopicConfig(TOPIC, 2, 2))
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pulls = [start_pull(link, pull_request(0, suspend_ms=60_000, queue_id=queue_id))
                     for queue_id in (0, 1)]
            await wait_until(lambda: hold.parked_count == 2, "both pulls parked")
            connection = next(iter(hold._parked.values()))[0].connection
            writes: list[int] = []  # frames parts in each write to the consumer
            flush = connection._flush

            def recording_flush() -> None:
                if connection._corked:
                    writes.append(len(connection._corked))
                flush()

            connection._flush = recording_flush
            for queue_id in (0, 1):  # stored in one loop iteration, as one read's sends are
                assert broker.store.put_message(message(body=b"q%d" % queue_id,
                                                        queue_id=queue_id)).ok
            async with asyncio.timeout(WAIT_BOUND_S):
                responses = await asyncio.gather(*pulls)
            assert [[m.body for m in iter_records(r.body)] for r in responses] == [
                [b"q0"], [b"q1"]]
            parts_per_response = len(responses[0].encode_parts())
            assert writes == [2 * parts_per_response]

    asyncio.run(main())


def test_many_parked_pulls_of_one_queue_are_all_answered_by_one_message(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            clients = [RemotingClient() for _ in range(3)]
            try:
                pending = [
                    asyncio.get_running_loop().create_task(
                        client.invoke(link.address, pull_request(0, suspend_ms=60_000), 30_000)
                    )
                    for client in clients
                ]
                await wait_until(lambda: hold.parked_count == 3, "three pulls parked")
                broker.store.put_message(message(body=b"one"))
                async with asyncio.timeout(WAIT_BOUND_S):
                    responses = await asyncio.gather(*pending)
                assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 3
            finally:
                for client in clients:
                    await client.close()

    asyncio.run(main())


def test_parked_pull_of_a_closed_connection_is_dropped(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            client = RemotingClient()
            pending = asyncio.get_running_loop().create_task(
                client.invoke(link.address, pull_request(0, suspend_ms=60_000), 30_000)
            )
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            await client.close()
            await wait_until(lambda: hold.parked_count == 0, "the parked pull dropped")
            await asyncio.gather(pending, return_exceptions=True)
            # A message for the queue now finds nobody to answer, and nothing breaks.
            assert broker.store.put_message(message()).ok
            response = await link.invoke(
                pull_request(0, suspend_ms=0, flags=PULL_FLAG_SUBSCRIPTION), 5000
            )
            assert response.code == ResponseCode.SUCCESS

    asyncio.run(main())


def test_stopping_long_polling_answers_parked_pulls(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        pending = None
        async with serve(broker) as link:
            client = RemotingClient()
            try:
                pending = asyncio.get_running_loop().create_task(
                    client.invoke(link.address, pull_request(0, suspend_ms=60_000), 30_000)
                )
                await wait_until(lambda: hold.parked_count == 1, "the pull parked")
                await broker.pull_hold_service.stop()
                async with asyncio.timeout(WAIT_BOUND_S):
                    response = await pending
                assert response.code == ResponseCode.PULL_NOT_FOUND
                assert hold.parked_count == 0
            finally:
                await client.close()

    asyncio.run(main())


class UnannouncedStore:
    """A store whose dispatches announce nothing: only the periodic re-check can see them."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def add_dispatch_listener(self, listener) -> None:
        """Dropped: no arrival is ever announced to the hold service."""

    def __getattr__(self, name):
        return getattr(self.inner, name)


def answered_samples(broker) -> dict[str, float]:
    """The broker's ``tidemq_broker_parked_pulls_answered_total`` samples, by cause."""
    return {sample.labels["cause"]: sample.value
            for family in BrokerCollector(broker.parts, lambda: 0).collect()
            for sample in family.samples
            if sample.name == "tidemq_broker_parked_pulls_answered_total"}


def test_parked_pulls_answered_are_counted_by_message_and_by_timeout(make_broker, serve):
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            clients = [RemotingClient() for _ in range(2)]
            try:
                woken = [asyncio.get_running_loop().create_task(client.invoke(
                    link.address, pull_request(0, suspend_ms=60_000), 30_000))
                    for client in clients]
                await wait_until(lambda: hold.parked_count == 2, "two pulls parked")
                assert hold.answered_by_cause == {"message": 0, "recheck": 0, "timeout": 0}
                broker.store.put_message(message(body=b"wake"))
                async with asyncio.timeout(WAIT_BOUND_S):
                    responses = await asyncio.gather(*woken)
                assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 2
                assert hold.answered_by_cause == {"message": 2, "recheck": 0, "timeout": 0}

                timed_out = start_pull(link, pull_request(1, suspend_ms=30))
                async with asyncio.timeout(WAIT_BOUND_S):
                    assert (await timed_out).code == ResponseCode.PULL_NOT_FOUND
                assert hold.answered_by_cause == {"message": 2, "recheck": 0, "timeout": 1}
                assert answered_samples(broker) == {"message": 2, "recheck": 0, "timeout": 1}
            finally:
                for client in clients:
                    await client.close()

    asyncio.run(main())


def test_a_message_only_the_recheck_sees_is_counted_as_the_rechecks(make_broker, serve):
    broker = broker_with_topic(make_broker, wrap_store=UnannouncedStore)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            assert broker.store.put_message(message(body=b"unannounced")).ok
            hold.recheck()  # what the 5 s timer does, now instead of in up to 5 s
            async with asyncio.timeout(WAIT_BOUND_S):
                response = await pending
            assert [m.body for m in iter_records(response.body)] == [b"unannounced"]
            assert hold.answered_by_cause == {"message": 0, "recheck": 1, "timeout": 0}
            assert answered_samples(broker) == {"message": 0, "recheck": 1, "timeout": 0}

    asyncio.run(main())


def test_the_recheck_leaves_an_announced_arrival_to_its_own_pass(make_broker, serve):
    # Announced but its pass not run yet: the re-check does not take the answer, so it counts
    # as the message's.
    broker = broker_with_topic(make_broker)
    hold = broker.pull_hold_service

    async def main():
        async with serve(broker) as link:
            pending = start_pull(link, pull_request(0, suspend_ms=60_000))
            await wait_until(lambda: hold.parked_count == 1, "the pull parked")
            # Appended on the loop thread: the dispatch notes the arrival and schedules the
            # pass with call_soon, which runs only once this coroutine yields.
            assert broker.store.put_message(message()).ok
            hold.recheck()
            assert hold.parked_count == 1
            async with asyncio.timeout(WAIT_BOUND_S):
                assert (await pending).code == ResponseCode.SUCCESS
            assert hold.answered_by_cause == {"message": 1, "recheck": 0, "timeout": 0}

    asyncio.run(main())
