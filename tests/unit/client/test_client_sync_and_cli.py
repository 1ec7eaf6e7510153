"""The synchronous twins and the admin/bench commands, without real servers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from client_fakes import FakeCluster

from tidemq.cli.admin_command import admin
from tidemq.cli.bench_command import bench, percentile
from tidemq.client.errors import ClientStateError
from tidemq.sync import Message, Producer, SendStatus


@pytest.fixture
def fake_cluster() -> Iterator[FakeCluster]:
    """A FakeCluster serving from its own thread and loop, as real servers would."""
    ready = threading.Event()
    holder: dict[str, object] = {}

    def serve() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            holder["stop"] = stop
            holder["loop"] = asyncio.get_running_loop()
            async with FakeCluster(1) as cluster:
                cluster.namesrv.add_topic("T", cluster.brokers, queue_nums=2)
                holder["cluster"] = cluster
                ready.set()
                await stop.wait()

        asyncio.run(main())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "fake cluster did not start"
    yield holder["cluster"]  # type: ignore[misc]
    holder["loop"].call_soon_threadsafe(holder["stop"].set)  # type: ignore[attr-defined]
    thread.join(10)


def test_sync_producer_sends_without_an_event_loop(fake_cluster):
    with Producer("pg", fake_cluster.namesrv.address) as producer:
        result = producer.send(Message("T", b"hello"))
        futures = [producer.send_async(Message("T", f"{i}")) for i in range(10)]
        results = [future.result(timeout=10) for future in futures]
        batch = producer.send_batch([Message("T", b"a"), Message("T", b"b")])
    assert result.status is SendStatus.SEND_OK
    assert len({r.msg_id for r in results}) == 10
    assert batch[0].msg_ids == batch[0].msg_id.split(",") and len(batch[0].msg_ids) == 2


def test_sync_twin_raises_the_async_clients_errors(fake_cluster):
    producer = Producer("pg", fake_cluster.namesrv.address)
    with pytest.raises(ClientStateError, match="start"):
        producer.send(Message("T", b"x"))
    producer.close()


def test_sync_call_from_the_clients_own_loop_thread_is_refused(fake_cluster):
    with Producer("pg", fake_cluster.namesrv.address) as producer:

        def selector(queues, message):
            producer.queues("T")  # a blocking twin call on the loop thread would deadlock
            return queues[0]

        with pytest.raises(RuntimeError, match="own event-loop thread"):
            producer.send(Message("T", b"x"), selector=selector)


def test_admin_verbs_accept_camel_and_kebab_case_and_fail_in_one_line():
    runner = CliRunner()
    for verb in ("topicList", "topic-list", "TOPICLIST"):
        result = runner.invoke(admin, [verb, "-n", "127.0.0.1:1"])
        assert result.exit_code == 1, verb
        assert "no name server answered" in result.output
        assert "Traceback" not in result.output
    unknown = runner.invoke(admin, ["noSuchVerb"])
    assert unknown.exit_code == 2 and "No such command" in unknown.output


def test_bench_needs_a_bound():
    result = CliRunner().invoke(bench, ["produce", "-n", "127.0.0.1:1"])
    assert result.exit_code == 2
    assert "--count or --seconds" in result.output


def test_percentile_uses_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.999) == 100.0
    assert percentile([], 0.5) is None
