"""The local offsets file of broadcasting consumers: survives restarts, never torn."""

from __future__ import annotations

from tidemq.client.message import MessageQueue
from tidemq.client.offset_store import LocalFileOffsetStore, local_offset_file

Q0 = MessageQueue("T", "broker-a", 0)
Q1 = MessageQueue("T", "broker-b", 1)


def test_offsets_written_by_one_store_are_read_by_the_next(run, tmp_path):
    path = local_offset_file("cg", "host-1", str(tmp_path))

    async def main():
        store = LocalFileOffsetStore(path)
        await store.load()
        assert await store.read_stored(Q0) is None
        store.update(Q0, 42)
        store.update(Q1, 7)
        await store.persist_all([Q0, Q1])
        again = LocalFileOffsetStore(path)
        await again.load()
        return await again.read_stored(Q0), await again.read_stored(Q1)

    assert run(main()) == (42, 7)
    assert path == tmp_path / "cg" / "host-1" / "offsets.json"


def test_the_file_is_rocketmqs_offset_table_json(run, tmp_path):
    path = tmp_path / "offsets.json"

    async def main():
        store = LocalFileOffsetStore(path)
        await store.load()
        store.update(Q0, 5)
        await store.persist_all([Q0])

    run(main())
    assert path.read_text() == (
        '{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:5}}')


def test_offsets_only_increase_unless_told_otherwise(run, tmp_path):
    async def main():
        store = LocalFileOffsetStore(tmp_path / "offsets.json")
        await store.load()
        store.update(Q0, 10)
        store.update(Q0, 3)
        first = store.read(Q0)
        store.update(Q0, 3, increase_only=False)
        return first, store.read(Q0)

    assert run(main()) == (10, 3)


def test_an_unreadable_file_falls_back_to_its_backup(run, tmp_path):
    path = tmp_path / "offsets.json"

    async def main():
        store = LocalFileOffsetStore(path)
        await store.load()
        store.update(Q0, 1)
        await store.persist_all([Q0])
        store.update(Q0, 2)
        await store.persist_all([Q0])  # the table with 1 is now offsets.json.bak
        path.write_bytes(b'{"offsetTable":{{"brokerName"')  # torn by hand
        again = LocalFileOffsetStore(path)
        await again.load()
        return await again.read_stored(Q0)

    assert run(main()) == 1
