"""SYNC_FLUSH over the network: a send is answered only after the sync covering its bytes
returned, however its response is written (broker/ha/flush_waits.py, LaterResponse)."""

from __future__ import annotations

import asyncio

from test_send_group import batch_request
from test_send_processor import send_request, with_topic

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.msgid import decode_offset_msg_id
from tidemq.store import sync_worker

WAIT_BOUND_S = 10.0  # any wait for something the test expects (never a timing assertion)


class GatedSync:
    """The group commit's syncs, held until the test opens the gate: the sync worker
    (store/sync_worker.py) waits before each sync until its hold file exists. Set up before
    the store opens (its worker reads the hold file's name at start)."""

    def __init__(self, tmp_path, monkeypatch) -> None:
        self._release = tmp_path / "sync-gate"
        monkeypatch.setenv(sync_worker.HOLD_ENV, str(self._release))
        self.store = None

    def watch(self, store) -> None:
        self.store = store

    def open(self) -> None:
        self._release.touch()

    def entered(self) -> bool:
        """A send's bytes are in the log: its sync command went to the worker with them."""
        return self.store.commit_log_max_offset() > 0

    def covers(self, physical_offset: int) -> bool:
        """Whether the log is known synced past ``physical_offset`` (moved only when the
        worker's sync returned)."""
        return self.store.commit_log.queue.flushed_where > physical_offset


async def wait_until(condition) -> None:
    async with asyncio.timeout(WAIT_BOUND_S):
        while not condition():
            await asyncio.sleep(0.005)


def answered_after_sync(sync: GatedSync, response: RemotingCommand) -> bool:
    """Whether a sync that had returned when ``response`` arrived covers its first record."""
    physical_offset = decode_offset_msg_id(response.ext_fields["msgId"].split(",")[0])[1]
    return sync.covers(physical_offset)


def test_sends_are_answered_only_after_the_sync_covering_them_returned(make_broker, serve,
                                                                      tmp_path, monkeypatch):
    sync = GatedSync(tmp_path, monkeypatch)
    broker = make_broker(store_kind="file", store_overrides={"flush_disk_type": "SYNC_FLUSH"})
    with_topic(broker, "Orders")
    sync.watch(broker.store)

    async def sends(link) -> list[tuple[RemotingCommand, bool]]:
        arrived: list[tuple[RemotingCommand, bool]] = []

        def send(request: RemotingCommand) -> asyncio.Task:
            task = asyncio.create_task(link.invoke(request, timeout_ms=60_000))
            # Judged as the response arrives, before the test opens the gate further.
            task.add_done_callback(lambda done: arrived.append(
                (done.result(), answered_after_sync(sync, done.result()))))
            return task

        # A lone send (the plain handler), then a read's worth: singles and a batch (the
        # group handler), all waiting behind the held sync.
        tasks = [send(send_request("Orders", b"lone"))]
        await wait_until(sync.entered)
        tasks += [send(send_request("Orders", f"m{n}".encode(), queue_id=n)) for n in range(3)]
        tasks.append(send(batch_request("Orders", [b"b1", b"b2"], queue_id=1)))
        await wait_until(lambda: broker.store.max_offset("Orders", 1) == 3)
        # Anything the broker wrote on this connection before it answered this request has
        # arrived once its answer has: no send may have been answered by now.
        probe = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert (await link.invoke(probe)).code == ResponseCode.SUCCESS
        assert arrived == []
        sync.open()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_BOUND_S)
        return arrived

    async def scenario():
        async with serve(broker) as link:
            try:
                return await sends(link)
            finally:
                sync.open()  # a failed check must not leave the sync held

    arrived = asyncio.run(scenario())
    assert len(arrived) == 5
    assert [response.code for response, _ in arrived] == [ResponseCode.SUCCESS] * 5
    assert all(after for _, after in arrived), arrived


def test_a_sync_later_than_sync_flush_timeout_is_answered_flush_disk_timeout(
        make_broker, serve, tmp_path, monkeypatch):
    sync = GatedSync(tmp_path, monkeypatch)
    broker = make_broker(store_kind="file", store_overrides={
        "flush_disk_type": "SYNC_FLUSH", "sync_flush_timeout_ms": 50})
    with_topic(broker, "Orders")
    sync.watch(broker.store)

    async def scenario():
        async with serve(broker) as link:
            try:
                return await asyncio.gather(
                    link.invoke(send_request("Orders", b"late"), timeout_ms=60_000),
                    link.invoke(batch_request("Orders", [b"b1", b"b2"], queue_id=2),
                                timeout_ms=60_000))
            finally:
                sync.open()

    responses = asyncio.run(scenario())
    assert [r.code for r in responses] == [ResponseCode.FLUSH_DISK_TIMEOUT] * 2
    assert all("syncFlushTimeout=50 ms" in r.remark for r in responses)
    assert all(r.ext_fields["msgId"] for r in responses)  # stored, and said so


def test_batches_appended_in_chunks_are_each_answered_only_after_a_sync_covering_them(
        make_broker, serve, tmp_path, monkeypatch):
    # Under SYNC_FLUSH an iteration's batches are appended a chunk at a time, each chunk with
    # its own sync (broker/batch_appender.py): no batch may be answered by a sync that does
    # not cover its last record.
    sync = GatedSync(tmp_path, monkeypatch)
    broker = make_broker(store_kind="file", store_overrides={"flush_disk_type": "SYNC_FLUSH"})
    with_topic(broker, "Orders")
    sync.watch(broker.store)
    appends: list[int] = []
    put_batches = broker.store.put_batches

    def recording_put_batches(batches):
        appends.append(len(batches))
        return put_batches(batches)

    broker.store.put_batches = recording_put_batches
    bodies = [b"c%d" % n for n in range(100)]  # 100 a batch: a 256-message chunk takes 3

    async def sends(link) -> list[tuple[RemotingCommand, bool]]:
        arrived: list[tuple[RemotingCommand, bool]] = []

        def judged(done: asyncio.Task) -> None:
            response = done.result()
            last = decode_offset_msg_id(response.ext_fields["msgId"].split(",")[-1])[1]
            arrived.append((response, sync.covers(last)))

        tasks = []
        for queue_id in range(4):
            task = asyncio.create_task(link.invoke(
                batch_request("Orders", bodies, queue_id=queue_id), timeout_ms=60_000))
            task.add_done_callback(judged)
            tasks.append(task)
        await wait_until(lambda: sum(appends) == 4)
        probe = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert (await link.invoke(probe)).code == ResponseCode.SUCCESS
        assert arrived == []  # every batch waits for the held sync
        sync.open()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_BOUND_S)
        return arrived

    async def scenario():
        async with serve(broker) as link:
            try:
                return await sends(link)
            finally:
                sync.open()

    arrived = asyncio.run(scenario())
    assert [response.code for response, _ in arrived] == [ResponseCode.SUCCESS] * 4
    assert all(after for _, after in arrived), arrived
    assert max(appends) <= 3  # no append took more than a chunk
