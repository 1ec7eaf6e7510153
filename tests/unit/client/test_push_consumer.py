"""PushConsumer behaviour against the in-process fake brokers (real sockets, real records):
delivery, offsets that never pass an unconsumed message, flow control, graceful shutdown,
the warning for a group whose members subscribe differently."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from client_fakes import FakeCluster

from tidemq.client.consume_service import PushStats
from tidemq.client.errors import ClientStateError, InvalidSubscription
from tidemq.client.listener import ConsumeResult
from tidemq.client.push_consumer import PushConsumer
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import decode_properties, encode_properties

GROUP = "cg"
TOPIC = "T"


def fill(cluster: FakeCluster, count: int, queue_nums: int = 2) -> None:
    cluster.namesrv.add_topic(TOPIC, cluster.brokers, queue_nums=queue_nums)
    for broker in cluster.brokers:
        for queue_id in range(queue_nums):
            for i in range(count):
                broker.store(TOPIC, queue_id, f"{broker.name}:{queue_id}:{i}".encode(),
                             encode_properties({"UNIQ_KEY": f"{broker.name}-{queue_id}-{i}"}))


def consumer_for(cluster: FakeCluster, **options) -> PushConsumer:
    options.setdefault("consume_from", "FIRST")
    options.setdefault("persist_consumer_offset_interval_ms", 50)
    consumer = PushConsumer(GROUP, cluster.namesrv.address, **options)
    consumer.subscribe(TOPIC, "*")
    return consumer


async def wait_for(condition, what: str, rounds: int = 400) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


def committed(cluster: FakeCluster) -> dict[tuple[str, int], int]:
    return {(b.name, queue_id): offset for b in cluster.brokers
            for (group, topic, queue_id), offset in b.offsets.items()
            if group == GROUP and topic == TOPIC}


def test_every_message_is_delivered_once_and_offsets_are_committed_at_close(run):
    async def main():
        async with FakeCluster(2) as cluster:
            fill(cluster, 70)
            seen: list[str] = []
            consumer = consumer_for(cluster, persist_consumer_offset_interval_ms=60_000)

            @consumer.listener
            def on_messages(messages):
                seen.extend(m.body.decode() for m in messages)

            async with consumer:
                await wait_for(lambda: len(seen) >= 280, "280 messages")
            stats = consumer.stats()
            return seen, committed(cluster), cluster.brokers[0].unregistered, stats

    seen, offsets, unregistered, stats = run(main())
    assert sorted(seen) == sorted(f"{b}:{q}:{i}" for b in ("broker-a", "broker-b")
                                  for q in range(2) for i in range(70))
    assert offsets == {(b, q): 70 for b in ("broker-a", "broker-b") for q in range(2)}
    assert any(u.get("consumerGroup") == GROUP for u in unregistered)  # it left the group
    assert isinstance(stats, PushStats) and stats.consumed == 280 and stats.failed == 0


def test_committed_offset_never_passes_a_message_still_being_consumed(run):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 20, queue_nums=1)
            release = asyncio.Event()
            done: list[int] = []
            consumer = consumer_for(cluster)

            @consumer.listener
            async def on_messages(messages):
                offset = messages[0].queue_offset
                if offset == 5:
                    await release.wait()  # stuck on offset 5 while later ones finish
                done.append(offset)

            async with consumer:
                await wait_for(lambda: len(done) == 19, "every message but offset 5")
                # A periodic commit after the 19: it must stop at the stuck offset 5 (a fixed
                # 0.2 s here could pass before any commit on a busy machine).
                await wait_for(lambda: committed(cluster).get(("broker-a", 0), -1) >= 5,
                               "a periodic commit")
                stuck = committed(cluster)[("broker-a", 0)]
                release.set()
                await wait_for(lambda: committed(cluster).get(("broker-a", 0)) == 20,
                               "the commit after offset 5 finished")
            return stuck

    assert run(main()) == 5


def test_pulling_pauses_while_a_queue_holds_its_threshold_of_messages(run):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 200, queue_nums=1)
            release = asyncio.Event()
            consumer = consumer_for(cluster, pull_batch_size=8, pull_threshold_for_queue=20)

            @consumer.listener
            async def on_messages(messages):
                await release.wait()

            async with consumer:
                await wait_for(lambda: consumer.stats().messages_pulled >= 20, "20 pulled")
                await asyncio.sleep(0.3)  # pulls would go on here without flow control
                held = consumer.stats().messages_pulled
                release.set()
                await wait_for(lambda: consumer.stats().consumed == 200, "all consumed")
            return held

    # at most one pull beyond the threshold: the check is made before each pull
    assert 20 <= run(main()) < 20 + 8 + 1


def test_close_waits_for_messages_in_flight_and_commits_them(run):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 40, queue_nums=1)
            started = asyncio.Event()
            consumed: list[int] = []
            consumer = consumer_for(cluster, persist_consumer_offset_interval_ms=60_000,
                                    consume_concurrency=1)

            @consumer.listener
            async def on_messages(messages):
                started.set()
                await asyncio.sleep(0.005)
                consumed.append(messages[0].queue_offset)

            await consumer.start()
            await started.wait()
            await consumer.close()
            return consumed, committed(cluster)

    consumed, offsets = run(main())
    assert offsets[("broker-a", 0)] == len(consumed)  # everything pulled was consumed first
    assert sorted(consumed) == list(range(len(consumed)))


def test_close_gives_up_after_its_timeout_without_committing_what_is_unconsumed(run):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 10, queue_nums=1)
            consumer = consumer_for(cluster, shutdown_timeout_ms=200)

            @consumer.listener
            async def on_messages(messages):
                if messages[0].queue_offset == 3:
                    await asyncio.sleep(3600)  # a listener that never finishes

            await consumer.start()
            await wait_for(lambda: consumer.stats().consumed == 9, "all but offset 3")
            await consumer.close()
            return committed(cluster)

    assert run(main()) == {("broker-a", 0): 3}


def test_members_subscribing_differently_are_warned_about(run, caplog):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 1, queue_nums=1)
            broker = cluster.brokers[0]

            async def connection_list(request, connection):
                return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=jsonx.dumps({
                    "connectionSet": [{"clientId": "10.9.9.9@other"}],
                    "subscriptionTable": {
                        TOPIC: {"subString": "TagB", "topic": TOPIC},
                        "%RETRY%cg": {"subString": "*", "topic": "%RETRY%cg"},
                    },
                }))

            broker.server.register(RequestCode.GET_CONSUMER_CONNECTION_LIST, connection_list)
            consumer = consumer_for(cluster)
            consumer.subscribe(TOPIC, "TagA")
            consumer.listener(lambda messages: None)
            with caplog.at_level(logging.WARNING, logger="tidemq.client"):
                async with consumer:
                    await consumer.rebalance()  # warned once per distinct difference
            return consumer.client_id

    client_id = run(main())
    warnings = [r.getMessage() for r in caplog.records
                if "subscribe differently" in r.getMessage()]
    assert len(warnings) == 1
    assert f"this member {client_id}" in warnings[0]
    assert "T: this member 'TagA', another 'TagB'" in warnings[0]
    assert "10.9.9.9@other" in warnings[0]


def test_start_needs_a_listener_and_a_subscription(run):
    async def main():
        async with FakeCluster(1) as cluster:
            no_listener = consumer_for(cluster)
            with pytest.raises(ClientStateError, match="has no listener"):
                await no_listener.start()
            await no_listener.close()
            nothing = PushConsumer(GROUP, cluster.namesrv.address)
            nothing.listener(lambda messages: None)
            with pytest.raises(InvalidSubscription, match="subscribes nothing"):
                await nothing.start()
            await nothing.close()
            started = consumer_for(cluster)
            started.listener(lambda messages: None)
            cluster.namesrv.add_topic(TOPIC, cluster.brokers, queue_nums=1)
            async with started:
                with pytest.raises(ClientStateError, match="before start"):
                    started.listener(lambda messages: None)

    run(main())


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="pull_threshold_for_queue=0"):
        PushConsumer(GROUP, "127.0.0.1:9876", pull_threshold_for_queue=0)
    with pytest.raises(ValueError, match="message_model='fanout'"):
        PushConsumer(GROUP, "127.0.0.1:9876", message_model="fanout")
    with pytest.raises(ValueError, match="allocation strategy 'random'"):
        PushConsumer(GROUP, "127.0.0.1:9876", allocation="random")


def test_failed_message_is_resent_to_the_retry_topic_when_the_send_back_fails(run):
    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 1, queue_nums=1)
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic("%RETRY%cg", [broker], queue_nums=1)
            deliveries: list[tuple[str, str | None, int]] = []
            consumer = consumer_for(cluster)

            @consumer.listener
            def on_messages(messages):
                message = messages[0]
                deliveries.append((message.topic, message.properties.get("RETRY_TOPIC"),
                                   len(deliveries)))
                return ConsumeResult.RECONSUME_LATER if len(deliveries) == 1 else None

            async with consumer:
                # the fake broker does not know CONSUMER_SEND_MSG_BACK: the consumer
                # re-sends the message to %RETRY%cg itself, and then consumes it from there
                await wait_for(lambda: len(deliveries) >= 2, "the retried message")
            resend = next(r for r in broker.sends if r.ext_fields["b"] == "%RETRY%cg")
            return deliveries, resend.ext_fields, consumer.stats()

    deliveries, fields, stats = run(main())
    assert deliveries == [("T", None, 0), ("T", "T", 1)]  # shown with its original topic
    properties = decode_properties(fields["i"])
    assert fields["j"] == "1" and fields["l"] == "16"  # reconsume times, limit: in the header
    assert "RECONSUME_TIME" not in properties and "MAX_RECONSUME_TIMES" not in properties
    assert properties["RETRY_TOPIC"] == "T"
    assert properties["DELAY"] == "3"  # 3 + reconsume times, as the broker would choose
    assert properties["ORIGIN_MESSAGE_ID"] == properties["UNIQ_KEY"] == "broker-a-0-0"
    assert stats.resent == 1 and stats.sent_back == 0


def test_sync_twin_runs_plain_listeners_in_threads_that_may_use_other_sync_clients(run):
    from tidemq import sync

    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 5, queue_nums=1)
            cluster.namesrv.add_topic("Out", cluster.brokers, queue_nums=1)

            def consume_and_forward() -> list[str]:
                threads: list[str] = []
                with sync.Producer("fwd", cluster.namesrv.address) as producer:
                    consumer = sync.PushConsumer(GROUP, cluster.namesrv.address,
                                                 consume_from="FIRST")
                    consumer.subscribe(TOPIC, "*")

                    @consumer.listener
                    def on_messages(messages):
                        threads.append(threading.current_thread().name)
                        for message in messages:  # a sync call from inside the listener
                            producer.send(sync.Message("Out", message.body))

                    consumer.start()
                    deadline = time.monotonic() + 10
                    while len(threads) < 5 and time.monotonic() < deadline:
                        time.sleep(0.02)
                    consumer.close()
                return threads

            threads = await asyncio.to_thread(consume_and_forward)
            return threads, len(cluster.brokers[0].messages("Out", 0))

    threads, forwarded = run(main())
    assert len(threads) == 5 and forwarded == 5
    assert not any(name == "tidemq-sync-loop" for name in threads)


def test_where_a_queue_without_a_committed_offset_starts(run):
    """LAST: only new messages, but a retry topic from its start; FIRST: everything;
    TIMESTAMP: from the first message stored at or after the time, a retry topic from its
    end; a committed offset wins (docs/protocol.md §15.5)."""

    async def main(consume_from: str, committed_offset: int | None = None):
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            cluster.namesrv.add_topic(TOPIC, [broker], queue_nums=1)
            cluster.namesrv.add_topic("%RETRY%cg", [broker], queue_nums=1)
            for i in range(6):
                broker.store(TOPIC, 0, f"old-{i}".encode(), store_timestamp=1_000 + i * 1000)
            broker.store("%RETRY%cg", 0, b"retried", encode_properties({"RETRY_TOPIC": TOPIC}))
            if committed_offset is not None:
                broker.offsets[(GROUP, TOPIC, 0)] = committed_offset
            got: list[str] = []
            consumer = consumer_for(cluster, consume_from=consume_from,
                                    consume_timestamp_ms=3_500)
            consumer.listener(lambda messages: got.extend(
                f"{m.topic}:{m.body.decode()}" for m in messages))
            async with consumer:
                await wait_for(lambda: all(consumer.offset_store.read(q) is not None
                                           for q in consumer.assignment()),
                               "both queues to have their starting offset")
                broker.store(TOPIC, 0, b"new")
                await wait_for(lambda: "T:new" in got, "the new message")
                await asyncio.sleep(0.1)
            return sorted(got)

    old = [f"T:old-{i}" for i in range(6)]
    assert run(main("LAST")) == ["T:new", "T:retried"]
    assert run(main("FIRST")) == sorted(["T:new", "T:retried", *old])
    assert run(main("TIMESTAMP")) == sorted(["T:new", *old[3:]])
    assert run(main("FIRST", committed_offset=4)) == sorted(["T:new", "T:retried", *old[4:]])


def test_a_broker_that_knows_no_member_yet_does_not_take_the_queues_away(run):
    # A master back from a restart has had no heartbeat yet and lists no member: the
    # consumer keeps its queues (as RocketMQ's does) instead of dropping them and taking them
    # back at a stale committed offset once its next heartbeat arrives.
    async def main():
        async with FakeCluster(1) as cluster:
            broker = cluster.brokers[0]
            fill(cluster, 5)
            seen: list[str] = []
            consumer = consumer_for(cluster, rebalance_interval_ms=50,
                                    heartbeat_broker_interval_ms=3_600_000)

            @consumer.listener
            def on_messages(messages):
                seen.extend(m.body.decode() for m in messages)

            async with consumer:
                await wait_for(lambda: len(seen) >= 10, "the first 10 messages")
                owned = set(consumer.process_queues)
                broker.heartbeats.clear()  # the broker forgot the group's members
                asked = broker.member_questions
                await wait_for(lambda: broker.member_questions >= asked + 3,
                               "rebalances against the forgetful broker")
                for queue_id in range(2):
                    broker.store(TOPIC, queue_id, f"late:{queue_id}".encode(),
                                 encode_properties({"UNIQ_KEY": f"late-{queue_id}"}))
                await wait_for(lambda: len(seen) >= 12, "the messages stored afterwards")
                return owned, set(consumer.process_queues), seen

    owned, still_owned, seen = run(main())
    assert owned and still_owned == owned
    assert sorted(seen) == sorted([f"broker-a:{q}:{i}" for q in range(2) for i in range(5)]
                                  + ["late:0", "late:1"])  # nothing consumed twice


def pull_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks()
            if t.get_name().startswith("tidemq-pull-") and not t.done()]


def test_a_drained_queue_is_delivered_from_the_read_callback_and_survives_a_lost_connection(
        run, monkeypatch):
    monkeypatch.setattr("tidemq.client.pull_consumer.PULL_DELAY_AFTER_TRANSPORT_ERROR_S", 0.05)

    async def main():
        async with FakeCluster(1) as cluster:
            fill(cluster, 2, queue_nums=1)
            broker = cluster.brokers[0]
            seen: list[str] = []
            consumer = consumer_for(cluster)

            @consumer.listener
            def on_messages(messages):
                seen.extend(m.body.decode() for m in messages)

            async with consumer:
                await wait_for(lambda: len(seen) == 2, "the backlog")
                # Drained: the pull is parked at the broker and no pull loop task waits.
                await wait_for(lambda: not pull_tasks(), "the parked pull")
                store_more(broker, 2, 3)
                await wait_for(lambda: len(seen) == 3, "a message arriving while parked")
                await wait_for(lambda: not pull_tasks(), "the next parked pull")
                consumer.instance.remoting.close_connection(broker.address)
                store_more(broker, 3, 5)
                await wait_for(lambda: len(seen) == 5, "messages after the connection closed")
                commits = [int(r.ext_fields["commitOffset"]) for r in broker.requests
                           if r.code == RequestCode.PULL_MESSAGE]
            return seen, commits, committed(cluster)

    seen, commits, offsets = run(main())
    assert seen == [f"broker-a:0:{i}" for i in range(5)]
    # Parked pulls carry the consumed offset to commit, as every push pull does.
    assert commits == sorted(commits) and commits[-1] >= 3
    assert offsets == {("broker-a", 0): 5}


def store_more(broker, start: int, stop: int) -> None:
    for i in range(start, stop):
        broker.store(TOPIC, 0, f"{broker.name}:0:{i}".encode(),
                     encode_properties({"UNIQ_KEY": f"{broker.name}-0-{i}"}))
