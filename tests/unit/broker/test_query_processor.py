"""QUERY_MESSAGE (by key, by unique key) and VIEW_MESSAGE_BY_ID (by commit-log offset)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.message import decode_record, iter_records
from tidemq.store.interface import StoreMessage

TOPIC = "TopicQuery"


@pytest.fixture
def setup(make_broker, handlers):
    broker = make_broker()
    table = handlers(broker)

    def ask(request: RemotingCommand) -> RemotingCommand:
        response = asyncio.run(table.ask(request))
        assert response.opaque == request.opaque
        return response

    return broker, ask


def put(broker, body: bytes, **properties: str) -> int:
    result = broker.store.put_message(StoreMessage(
        TOPIC, 0, body, properties, born_timestamp=int(time.time() * 1000),
        born_host="127.0.0.1:50000",
    ))
    assert result.ok, result.remark
    return result.physical_offset


def query_request(key: str, *, max_num: int = 32, unique: bool | None = None,
                  begin: int = 0, end: int | None = None) -> RemotingCommand:
    ext = {
        "topic": TOPIC, "key": key, "maxNum": str(max_num), "beginTimestamp": str(begin),
        "endTimestamp": str(end if end is not None else int(time.time() * 1000) + 60_000),
    }
    if unique is not None:
        ext["_UNIQUE_KEY_QUERY"] = "true" if unique else "false"
    return RemotingCommand.request(RequestCode.QUERY_MESSAGE, ext)


def test_query_by_key_returns_every_message_carrying_it(setup):
    broker, ask = setup
    put(broker, b"first", KEYS="order-1 customer-7")
    put(broker, b"other", KEYS="order-2")
    put(broker, b"second", KEYS="order-1")
    response = ask(query_request("order-1"))
    assert response.code == ResponseCode.SUCCESS
    assert sorted(m.body for m in iter_records(response.body)) == [b"first", b"second"]
    assert int(response.ext_fields["indexLastUpdatePhyoffset"]) > 0
    assert int(response.ext_fields["indexLastUpdateTimestamp"]) > 0
    by_customer = ask(query_request("customer-7"))
    assert [m.body for m in iter_records(by_customer.body)] == [b"first"]


def test_query_by_key_honours_max_num(setup):
    broker, ask = setup
    for i in range(5):
        put(broker, f"m{i}".encode(), KEYS="busy")
    response = ask(query_request("busy", max_num=2))
    assert len(list(iter_records(response.body))) == 2


def test_query_outside_the_time_range_finds_nothing(setup):
    broker, ask = setup
    put(broker, b"x", KEYS="order-1")
    response = ask(query_request("order-1", begin=0, end=1000))
    assert response.code == ResponseCode.QUERY_NOT_FOUND


def test_unknown_key_is_query_not_found_with_the_index_headers(setup):
    broker, ask = setup
    put(broker, b"x", KEYS="order-1")
    response = ask(query_request("no-such-key"))
    assert response.code == ResponseCode.QUERY_NOT_FOUND
    assert not response.body
    assert "no-such-key" in response.remark and TOPIC in response.remark
    assert set(response.ext_fields) == {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"}


def test_unique_key_query_uses_the_brokers_default_max_num(setup):
    broker, ask = setup
    unique_key = "7F0000010A2B18B4AAC2000000000001"
    put(broker, b"by id", UNIQ_KEY=unique_key)
    # maxNum 0 from the client is replaced by defaultQueryMaxNum (32) for unique-key queries.
    response = ask(query_request(unique_key, max_num=0, unique=True))
    assert response.code == ResponseCode.SUCCESS
    [message] = list(iter_records(response.body))
    assert message.unique_key == unique_key and message.body == b"by id"


def test_view_by_offset_returns_exactly_the_stored_record(setup):
    broker, ask = setup
    put(broker, b"before")
    offset = put(broker, b"wanted", TAGS="TagA")
    put(broker, b"after")
    response = ask(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                           {"offset": str(offset)}))
    assert response.code == ResponseCode.SUCCESS
    assert response.body == broker.store.read_message(offset)
    message = decode_record(response.body)
    assert (message.body, message.tags, message.physical_offset) == (b"wanted", "TagA", offset)
    assert message.store_size == len(response.body)


def test_view_by_an_offset_where_no_record_starts_names_the_offset(setup):
    broker, ask = setup
    offset = put(broker, b"only")
    for bad in (offset + 3, 10_000_000, -5):
        response = ask(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                               {"offset": str(bad)}))
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert f"can not find message by the offset, {bad}" in response.remark
    missing = ask(RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {}))
    assert missing.code == ResponseCode.SYSTEM_ERROR and "offset" in missing.remark
