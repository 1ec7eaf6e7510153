"""Group names are checked before any handler of a request that carries one."""

from __future__ import annotations

import asyncio
import json

import pytest

from tidemq.broker.group_names import GroupNameChecked, group_refusal
from tidemq.limits import group_name_problem, topic_name_problem
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand


@pytest.mark.parametrize("name", ["bad group\x01", "", " ", "x" * 256, "a/b", "new\nline",
                                  "trailing\n", "%RETRY%\x00"])
def test_malformed_group_names_are_named_with_the_problem(name):
    assert group_name_problem(name) is not None


def test_a_trailing_newline_no_longer_slips_through_the_name_rules():
    assert topic_name_problem("Orders\n") is not None
    assert group_name_problem("group\n") is not None
    assert group_name_problem("good_group-1|%") is None


@pytest.mark.parametrize(("code", "fields", "body"), [
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "bad group"}, None),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "bad group"}, None),
    (RequestCode.PULL_MESSAGE, {"consumerGroup": "bad group"}, None),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "bad group"}, None),
    (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "bad group"}, None),
    (RequestCode.UNREGISTER_CLIENT, {"producerGroup": "bad group"}, None),
    (RequestCode.HEART_BEAT, {}, {"consumerDataSet": [{"groupName": "bad group"}]}),
    (RequestCode.HEART_BEAT, {}, {"producerDataSet": [{"groupName": "bad group"}]}),
    (RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, {"groupName": "bad group"}),
    (RequestCode.LOCK_BATCH_MQ, {}, {"consumerGroup": "bad group", "mqSet": []}),
    (RequestCode.UNLOCK_BATCH_MQ, {}, {"consumerGroup": "bad group", "mqSet": []}),
])
def test_each_request_kind_is_refused_naming_the_field_and_value(code, fields, body):
    request = RemotingCommand.request(code, fields, json.dumps(body).encode() if body else None)
    remark = group_refusal(request)
    assert remark is not None and "'bad group'" in remark
    field = next(iter(fields)) if fields else ("groupName" if "groupName" in str(body)
                                                else "consumerGroup")
    assert field in remark


def test_the_wrapped_handler_never_runs_for_a_bad_name_and_runs_for_a_good_one():
    calls = []

    async def handler(request, connection):
        calls.append(request.ext_fields["consumerGroup"])
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    class Table:
        def __init__(self):
            self.routes = {}

        def register(self, code, handler, **options):
            self.routes[code] = handler

    table = Table()
    GroupNameChecked(table).register(RequestCode.UPDATE_CONSUMER_OFFSET, handler)
    route = table.routes[RequestCode.UPDATE_CONSUMER_OFFSET]
    bad = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "a b"})
    good = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "ab"})
    assert asyncio.run(route(bad, None)).code == ResponseCode.SYSTEM_ERROR
    assert asyncio.run(route(good, None)).code == ResponseCode.SUCCESS
    assert calls == ["ab"]


def test_names_that_passed_are_remembered_and_bad_names_are_still_refused(monkeypatch):
    from tidemq.broker import group_names

    monkeypatch.setattr(group_names, "VALID_GROUP_NAMES_MAX", 2)
    monkeypatch.setattr(group_names, "_valid_group_names", set())

    def pull(group):
        return RemotingCommand.request(RequestCode.PULL_MESSAGE, {"consumerGroup": group})

    assert group_refusal(pull("good-1")) is None
    assert group_refusal(pull("good-1")) is None  # remembered: no second regex
    assert group_names._valid_group_names == {"good-1"}
    assert group_refusal(pull("bad group")) is not None
    assert group_refusal(pull("bad group")) is not None  # a refused name is never remembered
    for name in ("good-2", "good-3"):
        assert group_refusal(pull(name)) is None
    assert group_names._valid_group_names == {"good-3"}  # bounded: it started over
