"""The HA stream in one process: a master's HAService and a slave's HAClient over loopback TCP,
each on its own in-memory store (broker/ha/, store/replication.py).

The slave's master check is stubbed here (it asks the master's remoting port, which needs a
whole broker; tests/integration runs it for real).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct

import pytest

from tidemq.broker.ha import HAClient, HAService, HASettings
from tidemq.broker.ha.wire import (
    CHUNK_HEADER_SIZE,
    ChunkDecoder,
    ReportDecoder,
    encode_chunk_header,
    encode_report,
)
from tidemq.errors import RemoteProtocolError
from tidemq.store.config import StoreConfig
from tidemq.store.interface import StoreMessage
from tidemq.store.memory_store import MemoryMessageStore

SEGMENT = 256 * 1024
FAST = HASettings(transfer_batch_size=32 * 1024, heartbeat_interval_s=0.2,
                  housekeeping_interval_s=2.0, max_gap_not_in_sync=64 * 1024)
WAIT_S = 20.0


def new_store() -> MemoryMessageStore:
    return MemoryMessageStore(StoreConfig(mapped_file_size_commit_log=SEGMENT,
                                          mapped_file_size_consume_queue=2000))


def put_some(store: MemoryMessageStore, rng: random.Random, count: int) -> None:
    for i in range(count):
        body = rng.randbytes(rng.randrange(10, 4000))
        result = store.put_message(StoreMessage("Orders", i % 4, body, {"KEYS": f"k{i}"}))
        assert result.ok


async def until(condition, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def log_bytes(store: MemoryMessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    while start < end:
        chunk = store.read_commit_log(start, 1 << 20)
        assert chunk
        out += chunk
        start += len(chunk)
    return bytes(out)


class StubCheck:
    def __init__(self, problem: str | None = None) -> None:
        self.answer = problem
        self.asked: list[str] = []

    async def problem(self, master_addr: str) -> str | None:
        self.asked.append(master_addr)
        return self.answer


# -- the byte formats ---------------------------------------------------------------------------


def test_reports_decode_whole_byte_by_byte_and_split():
    stream = encode_report(5) + encode_report(1 << 40) + encode_report(7)
    assert ReportDecoder().feed(stream) == 7
    decoder = ReportDecoder()
    seen = [decoder.feed(bytes([b])) for b in stream]
    assert [s for s in seen if s is not None] == [5, 1 << 40, 7]
    decoder = ReportDecoder()
    assert decoder.feed(stream[:12]) == 5
    assert decoder.feed(stream[12:]) == 7


def test_a_negative_report_is_garbage():
    with pytest.raises(RemoteProtocolError, match="negative"):
        ReportDecoder().feed(encode_report(3) + struct.pack(">q", -1))


def test_chunks_decode_across_reads_and_oversized_headers_are_refused():
    stream = encode_chunk_header(100, 3) + b"abc" + encode_chunk_header(103, 0)
    decoder = ChunkDecoder()
    chunks = [c for b in stream for c in decoder.feed(bytes([b]))]
    assert [(c.offset, c.data) for c in chunks] == [(100, b"abc"), (103, b"")]
    with pytest.raises(RemoteProtocolError, match="not a master's chunk"):
        ChunkDecoder(chunk_size_max=1024).feed(encode_chunk_header(0, 1025))
    assert len(encode_chunk_header(0, 0)) == CHUNK_HEADER_SIZE


# -- master and slave ---------------------------------------------------------------------------


async def start_pair(master_store, slave_store, check=None, settings=FAST):
    service = HAService(master_store, "127.0.0.1", 0, settings, "broker-a")
    await service.start()
    master_store.add_dispatch_listener(lambda *_: service.notify_appended())
    client = HAClient(slave_store, check or StubCheck(), settings, service.address, "broker-a")
    client.start()
    return service, client


def test_slave_copies_the_masters_log_byte_for_byte_and_keeps_up():
    async def main() -> None:
        master, slave = new_store(), new_store()
        rng = random.Random(3)
        put_some(master, rng, 300)  # several segments before the slave connects
        service, client = await start_pair(master, slave)
        try:
            await until(lambda: slave.commit_log_max_offset() == master.commit_log_max_offset(),
                        "catch-up")
            put_some(master, rng, 100)  # and it keeps up with new appends
            end = master.commit_log_max_offset()
            await until(lambda: slave.replicated_confirmed_offset() == end, "new appends")
            assert log_bytes(slave, 0, end) == log_bytes(master, 0, end)
            for queue_id in range(4):
                ours = slave.get_messages("Orders", queue_id, 0, 1000, 1 << 30)
                theirs = master.get_messages("Orders", queue_id, 0, 1000, 1 << 30)
                assert ours.body == theirs.body and ours.message_count > 0
            assert slave.query_messages("Orders", "k350", 4, 0, 1 << 62).records == \
                master.query_messages("Orders", "k350", 4, 0, 1 << 62).records
            await until(lambda: service.in_sync_slave_count() == 1, "in-sync state")
            assert service.slave_fall_behind_bytes() == 0
        finally:
            await client.stop()
            await service.stop()

    asyncio.run(main())


def test_a_wait_is_answered_once_the_slave_acknowledged_and_many_share_one_ack():
    async def main() -> None:
        master, slave = new_store(), new_store()
        service, client = await start_pair(master, slave)
        try:
            await until(lambda: service.in_sync_slave_count() == 1, "connection")
            ends = []
            for _ in range(50):
                result = master.put_message(StoreMessage("Orders", 0, b"x" * 100, {}))
                ends.append(result.physical_offset + result.wrote_bytes)
            answers = await asyncio.gather(*(service.wait_for_slave(e, 10.0) for e in ends))
            assert all(answers)
            assert slave.commit_log_max_offset() >= ends[-1]
        finally:
            await client.stop()
            await service.stop()
        # Without a slave nobody acknowledges: the wait ends False at its timeout.
        lonely = HAService(new_store(), "127.0.0.1", 0, FAST)
        await lonely.start()
        try:
            assert await lonely.wait_for_slave(100, 0.2) is False
            assert lonely.in_sync_slave_count() == 0
        finally:
            await lonely.stop()

    asyncio.run(main())


def test_garbage_on_the_ha_port_closes_only_that_connection(caplog):
    async def main() -> None:
        master, slave = new_store(), new_store()
        put_some(master, random.Random(1), 20)
        service, client = await start_pair(master, slave)
        try:
            await until(lambda: service.in_sync_slave_count() == 1, "the real slave")
            for garbage in (struct.pack(">q", -5), encode_report(1 << 50), b"\xff" * 16):
                reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
                writer.write(garbage)
                await writer.drain()
                async with asyncio.timeout(WAIT_S):
                    while await reader.read(65536):
                        pass  # the master may send a chunk or two before it reads the report
                writer.close()
            put_some(master, random.Random(2), 20)
            end = master.commit_log_max_offset()
            await until(lambda: slave.replicated_confirmed_offset() == end, "the slave goes on")
            assert service.in_sync_slave_count() == 1
        finally:
            await client.stop()
            await service.stop()

    with caplog.at_level(logging.WARNING, logger="tidemq.broker.ha"):
        asyncio.run(main())
    closes = [r.getMessage() for r in caplog.records if "closing HA connection" in r.getMessage()]
    assert len(closes) == 3, closes
    assert any("negative" in c for c in closes)
    assert any("ahead of ours" in c for c in closes)


def test_a_slave_whose_check_fails_copies_nothing_and_says_so_once(caplog):
    async def main() -> None:
        master, slave = new_store(), new_store()
        put_some(master, random.Random(1), 20)
        check = StubCheck("the master at x is broker 'b' of cluster 'c'")
        service, client = await start_pair(master, slave, check)
        try:
            await until(lambda: len(check.asked) >= 3, "retried checks")
            assert slave.commit_log_max_offset() == 0
            assert service.connections == []
            assert client.refused is not None
        finally:
            await client.stop()
            await service.stop()

    with caplog.at_level(logging.ERROR, logger="tidemq.broker.ha"):
        asyncio.run(main())
    refusals = [r for r in caplog.records if "refuses to copy" in r.getMessage()]
    assert len(refusals) == 1


def test_a_silent_peer_is_dropped_after_the_housekeeping_interval(caplog):
    async def main() -> None:
        service = HAService(new_store(), "127.0.0.1", 0,
                            HASettings(housekeeping_interval_s=0.3, heartbeat_interval_s=0.1))
        await service.start()
        try:
            sock = socket.create_connection(("127.0.0.1", service.port))
            sock.sendall(b"\x00\x00\x00")  # a partial report, then silence
            await until(lambda: len(service.connections) == 1, "accept")
            await until(lambda: service.connections == [], "housekeeping")
            sock.close()
        finally:
            await service.stop()

    with caplog.at_level(logging.WARNING, logger="tidemq.broker.ha"):
        asyncio.run(main())
    assert any("haHousekeepingInterval" in r.getMessage() for r in caplog.records)


# -- SYNC_MASTER statuses -----------------------------------------------------------------------


def test_sync_master_answers_ok_timeout_or_not_available_as_the_slave_behaves():
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.ha.replication import Replication
    from tidemq.store.interface import PutStatus

    async def main() -> None:
        master = new_store()
        store_config = StoreConfig(sync_flush_timeout_ms=300, ha_send_heartbeat_interval_ms=200,
                                   ha_max_gap_not_in_sync=1 << 20)
        replication = Replication(BrokerConfig(broker_role="SYNC_MASTER"), store_config, master,
                                  "127.0.0.1", 0)
        await replication.start()
        try:
            def put():
                return master.put_message(StoreMessage("Orders", 0, b"x" * 100, {}))

            # No slave at all.
            assert await replication.stored_status(put(), True) is PutStatus.SLAVE_NOT_AVAILABLE
            # A producer that does not wait is answered at once.
            assert await replication.stored_status(put(), False) is PutStatus.PUT_OK
            # A "slave" that reports once and then never acknowledges anything more.
            end = master.commit_log_max_offset()
            _reader, writer = await asyncio.open_connection("127.0.0.1", replication.ha_port)
            writer.write(encode_report(end))
            await until(lambda: replication.service.in_sync_slave_count() == 1, "stalled slave")
            assert await replication.stored_status(put(), True) is PutStatus.FLUSH_SLAVE_TIMEOUT
            writer.close()
            await until(lambda: replication.service.connections == [], "stalled slave gone")
            # A real slave.
            slave = new_store()
            client = HAClient(slave, StubCheck(), replication.service.settings,
                              replication.service.address)
            client.start()
            try:
                await until(lambda: replication.service.in_sync_slave_count() == 1, "slave")
                results = [put() for _ in range(20)]
                statuses = await asyncio.gather(
                    *(replication.stored_status(r, True) for r in results))
                assert set(statuses) == {PutStatus.PUT_OK}
                info = replication.runtime_info()
                assert info["brokerRole"] == "SYNC_MASTER" and info["inSyncSlaveNums"] == "1"
            finally:
                await client.stop()
        finally:
            await replication.stop()

    asyncio.run(main())


def test_caught_up_fell_behind_and_back_in_sync_are_logged_once_each(caplog):
    async def main() -> None:
        master = new_store()
        put_some(master, random.Random(4), 5)
        service = HAService(master, "127.0.0.1", 0,
                            HASettings(max_gap_not_in_sync=1024, heartbeat_interval_s=0.2,
                                       housekeeping_interval_s=5.0), "broker-a")
        await service.start()
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
            start = master.commit_log_max_offset()
            for _ in range(3):  # reports of the same offset: one "caught up"
                writer.write(encode_report(start))
                await writer.drain()
            await until(lambda: service.connections and service.connections[0].in_sync,
                        "in sync")
            put_some(master, random.Random(5), 10)  # far more than the 1 KiB gap
            for _ in range(3):
                writer.write(encode_report(start))
                await writer.drain()
            await until(lambda: not service.connections[0].in_sync, "fell behind")
            end = master.commit_log_max_offset()
            for _ in range(3):
                writer.write(encode_report(end))
                await writer.drain()
            await until(lambda: service.connections[0].in_sync, "back in sync")
            writer.close()
        finally:
            await service.stop()

    with caplog.at_level(logging.INFO, logger="tidemq.broker.ha"):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert sum("caught up" in m for m in messages) == 1, messages
    assert sum("fell behind" in m for m in messages) == 1, messages
    assert sum("back in sync" in m for m in messages) == 1, messages
    assert sum("connected to broker" in m for m in messages) == 1, messages
