"""What a broker and a client make as they start, so the first message costs what later ones
do: the send and pull headers' codecs compiled, the store's first index file and its queue-file
thread started (not at the first send, on the event loop)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from tidemq.client.instance import ClientInstance
from tidemq.protocol import headers
from tidemq.protocol.headers import MESSAGE_PATH_HEADERS, compile_codecs


@pytest.fixture
def no_compiled_codecs(monkeypatch):
    """Forget every compiled header codec for the test (the process has compiled some)."""
    monkeypatch.setattr(headers, "_READERS", {})
    monkeypatch.setattr(headers, "_WRITERS", {})


def refuse_compiling(monkeypatch):
    def refuse(cls, short):
        raise AssertionError(f"{cls.__name__} (short={short}) compiled at its first use")

    monkeypatch.setattr(headers, "_compile_reader", refuse)
    monkeypatch.setattr(headers, "_compile_writer", refuse)


def preparer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tidemq-queue-file-preparer"]


def test_compiled_codecs_read_and_write_without_compiling_again(no_compiled_codecs,
                                                                 monkeypatch):
    compile_codecs(*MESSAGE_PATH_HEADERS)
    refuse_compiling(monkeypatch)
    header = headers.PullMessageRequestHeader(
        consumer_group="g", topic="T", queue_id=1, queue_offset=5, max_msg_nums=32,
        sys_flag=0, commit_offset=0, suspend_timeout_millis=15000, subscription="*",
        sub_version=0, expression_type="TAG")
    assert headers.PullMessageRequestHeader.from_ext_fields(header.to_ext_fields()) == header
    send = headers.SendMessageRequestHeader(
        producer_group="p", topic="T", default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=1, flag=0)
    for v2, code in ((True, 310), (False, 10)):
        assert headers.SendMessageRequestHeader.from_ext_fields(
            send.to_ext_fields(v2=v2), code) == send


def test_a_started_broker_compiled_its_codecs_and_prepared_its_store(
        make_broker, serve, no_compiled_codecs, monkeypatch):
    broker = make_broker(store_kind="file")
    index_dir = os.path.join(broker.store.root_dir, "index")
    threads_before = set(preparer_threads())

    async def started():
        async with serve(broker):
            refuse_compiling(monkeypatch)
            for cls in MESSAGE_PATH_HEADERS:  # every form of each, without a compile
                for short in (False, True):
                    assert (cls, short) in headers._READERS
                    assert (cls, short) in headers._WRITERS
            return (len(os.listdir(index_dir)),
                    set(preparer_threads()) - threads_before)

    index_files, new_threads = asyncio.run(started())
    assert index_files == 1  # made at start, before any message
    assert len(new_threads) == 1  # the queue-file thread runs before any send


def test_a_started_client_compiled_its_codecs(no_compiled_codecs):
    async def started():
        instance = ClientInstance("127.0.0.1:9")  # nothing is asked of the name server here
        await instance.start()
        try:
            return {cls for cls in MESSAGE_PATH_HEADERS
                    if (cls, False) in headers._READERS and (cls, True) in headers._WRITERS}
        finally:
            await instance.close()

    assert asyncio.run(started()) == set(MESSAGE_PATH_HEADERS)
