"""A store written by tidemq, read back by a small independent reader.

The reader below knows only the byte layouts of docs/protocol.md §6.1 (stored record), §10.1
(file names), §10.2 (consume-queue entries) and §10.4 (checkpoint); it unpacks them with
struct by hand and uses nothing of tidemq's codec, so a layout bug in the store cannot hide
behind the same bug in the decoder.
"""

from __future__ import annotations

import os
import struct
import zlib

from store_helpers import SEGMENT_SIZE, message

from tidemq.store.file_store import FileMessageStore

MAGIC = 0xDAA320A7
BLANK = 0xCBD43194


def read_commit_log(root):
    """Every record of the commit log as a dict, in order; checks the blank markers."""
    directory = os.path.join(root, "commitlog")
    names = sorted(os.listdir(directory))
    records = []
    for index, name in enumerate(names):
        assert len(name) == 20 and int(name) == index * SEGMENT_SIZE
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        assert len(data) == SEGMENT_SIZE
        position = 0
        while position < len(data):
            total, magic = struct.unpack_from(">iI", data, position)
            if magic == BLANK:
                assert total == len(data) - position  # the marker says what is left
                break
            if total == 0:
                break
            assert magic == MAGIC
            (crc, queue_id, flag, queue_offset, physical_offset, sysflag, born_ts) = (
                struct.unpack_from(">iiiqqiq", data, position + 8)
            )
            born_ip = data[position + 48 : position + 52]
            (born_port, store_ts) = struct.unpack_from(">iq", data, position + 52)
            store_ip = data[position + 64 : position + 68]
            (store_port, reconsume, prepared, body_length) = struct.unpack_from(
                ">iiqi", data, position + 68
            )
            body = data[position + 88 : position + 88 + body_length]
            cursor = position + 88 + body_length
            topic_length = data[cursor]
            topic = data[cursor + 1 : cursor + 1 + topic_length].decode()
            cursor += 1 + topic_length
            (properties_length,) = struct.unpack_from(">h", data, cursor)
            properties = data[cursor + 2 : cursor + 2 + properties_length].decode()
            assert cursor + 2 + properties_length - position == total
            assert crc == zlib.crc32(body) & 0x7FFFFFFF
            assert physical_offset == index * SEGMENT_SIZE + position
            records.append({
                "total": total, "queue_id": queue_id, "flag": flag,
                "queue_offset": queue_offset, "physical_offset": physical_offset,
                "sysflag": sysflag, "born_timestamp": born_ts,
                "born_host": (".".join(map(str, born_ip)), born_port),
                "store_timestamp": store_ts,
                "store_host": (".".join(map(str, store_ip)), store_port),
                "reconsume_times": reconsume, "prepared_offset": prepared,
                "body": body, "topic": topic,
                "properties": dict(
                    item.split("\x01", 1) for item in properties.split("\x02") if item
                ),
            })
            position += total
    return records


def read_consume_queue(root, topic, queue_id):
    directory = os.path.join(root, "consumequeue", topic, str(queue_id))
    entries = []
    for name in sorted(os.listdir(directory)):
        assert int(name) == len(entries) * 20  # named by the byte offset of its first entry
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        for position in range(0, len(data), 20):
            physical_offset, size, tag_code = struct.unpack_from(">qiq", data, position)
            if size == 0:
                break
            entries.append((physical_offset, size, tag_code))
    return entries


def java_hash(text):
    value = 0
    for unit in struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H",
                              text.encode("utf-16-be")):
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def test_files_follow_rocketmq_layouts_byte_for_byte(config):
    root = config.store_path_root_dir
    store = FileMessageStore(config)
    puts = []
    for i in range(150):
        puts.append(store.put_message(message(
            queue_id=i % 2, body=f"body-{i}".encode() * 60, tags=("TagA", "TagB")[i % 2],
            keys=f"key-{i}", flag=i, born_timestamp=1_700_000_000_000 + i,
            born_host="192.168.1.20:40000", reconsume_times=i % 4,
        )))
    puts.append(store.put_messages([message(queue_id=1, body=b"batched") for _ in range(10)]))
    store.close()

    records = read_commit_log(root)
    assert len(records) == 160
    assert len({r["physical_offset"] // SEGMENT_SIZE for r in records}) > 1  # rolled
    first = records[0]
    assert first["topic"] == "Orders"
    assert first["body"] == b"body-0" * 60
    assert first["properties"] == {"TAGS": "TagA", "KEYS": "key-0"}
    assert first["born_host"] == ("192.168.1.20", 40000)
    assert first["store_host"] == ("127.0.0.1", 10911)
    assert first["born_timestamp"] == 1_700_000_000_000
    assert first["store_timestamp"] == puts[0].store_timestamp
    assert records[7]["flag"] == 7 and records[7]["reconsume_times"] == 3
    assert [r["physical_offset"] for r in records[:150]] == [p.physical_offset for p in puts[:150]]

    for queue_id in (0, 1):
        entries = read_consume_queue(root, "Orders", queue_id)
        mine = [r for r in records if r["queue_id"] == queue_id]
        assert [r["queue_offset"] for r in mine] == list(range(len(mine)))
        assert entries == [
            (r["physical_offset"], r["total"], java_hash(r["properties"].get("TAGS", "")))
            if r["properties"].get("TAGS") else (r["physical_offset"], r["total"], 0)
            for r in mine
        ]

    with open(os.path.join(root, "checkpoint"), "rb") as f:
        checkpoint = f.read()
    assert len(checkpoint) == 4096
    physic, logics, index = struct.unpack_from(">qqq", checkpoint, 0)
    assert physic == logics == puts[-1].store_timestamp
    assert index == puts[-2].store_timestamp  # the newest record with keys (the batch has none)
    assert sorted(os.listdir(root)) == ["checkpoint", "commitlog", "consumequeue", "index",
                                        "lock"]
