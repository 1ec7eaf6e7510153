"""The ACL check of single requests: each refusal with NO_PERMISSION and a remark that says
which key, which resource and which permission; what is allowed passes."""

from __future__ import annotations

import orjson
import pytest
from acl_helpers import signed, write_acl

from tidemq.acl import AclValidator, load_acl_file
from tidemq.acl.permission import NAMESRV_CHECKED_CODES
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import SIGNATURE

PEER = "192.168.7.7:40000"


@pytest.fixture
def validator(tmp_path):
    return AclValidator(load_acl_file(write_acl(tmp_path)))


def send(topic: str, group: str = "pg", body: bytes = b"hello") -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2,
                                   {"a": group, "b": topic, "c": "TBW102", "e": "0"}, body)


def pull(topic: str, group: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.PULL_MESSAGE,
                                   {"consumerGroup": group, "topic": topic, "queueId": "0"})


def refused(validator, request, peer=PEER) -> str:
    refusal = validator.check(request, peer)
    assert refusal is not None, "expected a refusal"
    code, remark = refusal
    assert code == ResponseCode.NO_PERMISSION
    return remark


def test_signed_requests_within_their_permissions_pass(validator):
    assert validator.check(signed(send("Orders"), "publisher", "pub-secret"), PEER) is None
    assert validator.check(signed(pull("Orders", "billing"), "consumer", "sub-secret"),
                           PEER) is None
    delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"})
    assert validator.check(signed(delete, "operator", "admin-secret"), PEER) is None


def test_unsigned_request_is_refused_naming_the_fix(validator):
    remark = refused(validator, send("Orders"))
    assert "not signed" in remark and "192.168.7.7" in remark
    assert "globalWhiteRemoteAddresses" in remark


def test_request_without_ext_fields_is_refused(validator):
    assert "not signed" in refused(validator, RemotingCommand.request(RequestCode.HEART_BEAT))


def test_unknown_access_key_is_refused(validator):
    remark = refused(validator, signed(send("Orders"), "stranger", "pub-secret"))
    assert "'stranger' is not an account" in remark


def test_wrong_secret_is_refused(validator):
    remark = refused(validator, signed(send("Orders"), "publisher", "not-the-secret"))
    assert "'publisher'" in remark and "does not match" in remark


@pytest.mark.parametrize("garble", ["", "!!!", "1BsW91JsORxjhwjLy6Ma1jP/kow=", "\udcff"])
def test_garbled_or_missing_signature_is_refused(validator, garble):
    request = signed(send("Orders"), "publisher", "pub-secret")
    request.ext_fields[SIGNATURE] = garble
    assert "does not match" in refused(validator, request)
    del request.ext_fields[SIGNATURE]
    assert "has no Signature" in refused(validator, request)


def test_a_changed_body_or_header_breaks_the_signature(validator):
    request = signed(send("Orders"), "publisher", "pub-secret")
    request.body = b"hellO"
    assert "does not match" in refused(validator, request)
    request = signed(send("Orders"), "publisher", "pub-secret")
    request.ext_fields["b"] = "Audit"
    assert "does not match" in refused(validator, request)


def test_sub_only_key_cannot_send(validator):
    remark = refused(validator, signed(send("Audit"), "publisher", "pub-secret"))
    assert "'publisher' has no PUB permission on topic 'Audit'" in remark
    assert "SUB (listed for it)" in remark
    remark = refused(validator, signed(send("Other"), "consumer", "sub-secret"))
    assert "no PUB permission on topic 'Other'" in remark and "defaultTopicPerm" in remark


def test_pub_only_key_cannot_consume(validator):
    remark = refused(validator, signed(pull("Orders", "billing"), "publisher", "pub-secret"))
    assert "'publisher' has no SUB permission on topic 'Orders'" in remark
    remark = refused(validator, signed(pull("Orders", "blocked"), "consumer", "sub-secret"))
    assert "no SUB permission on group 'blocked'" in remark and "groupPerms" in remark


def test_batch_send_is_checked_like_a_single_send(validator):
    batch = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, {"a": "pg", "b": "Audit"},
                                    b"x")
    assert "no PUB permission" in refused(validator, signed(batch, "publisher", "pub-secret"))


def test_heartbeat_needs_sub_on_every_group_and_topic(validator):
    body = orjson.dumps({"clientID": "c", "producerDataSet": [], "consumerDataSet": [
        {"groupName": "billing", "subscriptionDataSet": [{"topic": "Secret"}]}]})
    request = RemotingCommand.request(RequestCode.HEART_BEAT, {}, body)
    assert "topic 'Secret'" in refused(validator, signed(request, "consumer", "sub-secret"))
    request = RemotingCommand.request(RequestCode.HEART_BEAT, {}, b"{not json")
    assert "cannot be checked" in refused(validator, signed(request, "consumer", "sub-secret"))


def test_non_admin_cannot_delete_a_topic(validator):
    delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"})
    remark = refused(validator, signed(delete, "consumer", "sub-secret"))
    assert "DELETE_TOPIC_IN_BROKER" in remark and "needs an admin account" in remark
    assert "'consumer'" in remark


def test_white_listed_peers_pass_unsigned(validator):
    assert validator.check(send("Anything"), "10.9.9.200:5555") is None
    delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Orders"})
    assert validator.check(delete, "10.9.9.1:5555") is None
    # an account's own white address skips its signature, not the access key
    request = send("Orders")
    request.ext_fields["AccessKey"] = "trusted-host"
    assert validator.check(request, "10.1.1.2:6000") is None
    assert "has no Signature" in refused(validator, request, "10.1.1.3:6000")


def test_trace_topic_publishing_is_always_allowed(validator):
    trace = signed(send("RMQ_SYS_TRACE_TOPIC"), "consumer", "sub-secret")
    assert validator.check(trace, PEER) is None


def test_name_server_checks_only_its_write_codes(tmp_path):
    validator = AclValidator(load_acl_file(write_acl(tmp_path)),
                             checked_codes=NAMESRV_CHECKED_CODES)
    route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
    assert validator.check(route, PEER) is None
    put_kv = RemotingCommand.request(RequestCode.PUT_KV_CONFIG,
                                     {"namespace": "n", "key": "k", "value": "v"})
    assert "not signed" in refused(validator, put_kv)
    assert "needs an admin" in refused(validator, signed(put_kv, "consumer", "sub-secret"))
    assert validator.check(signed(put_kv, "operator", "admin-secret"), PEER) is None


def test_large_bodies_defer_only_the_signature_and_decide_the_same(tmp_path):
    from tidemq.acl.validator import PendingSignature

    deferring = AclValidator(load_acl_file(write_acl(tmp_path)), defer_body_bytes_min=1024)
    big = b"x" * 4096
    ok = signed(send("Orders", body=big), "publisher", "pub-secret")
    verdict = deferring.check(ok, PEER)
    assert isinstance(verdict, PendingSignature) and verdict.decide() is None
    wrong = signed(send("Orders", body=big), "publisher", "not-the-secret")
    assert "does not match" in deferring.check(wrong, PEER).decide()[1]
    unpermitted = signed(send("Audit", body=big), "publisher", "pub-secret")
    assert "no PUB permission" in deferring.check(unpermitted, PEER).decide()[1]
    # a bad signature wins over a missing permission, as when checked in order
    both = signed(send("Audit", body=big), "publisher", "not-the-secret")
    assert "does not match" in deferring.check(both, PEER).decide()[1]
    # small bodies and the cheap refusals are decided at once
    assert deferring.check(signed(send("Orders"), "publisher", "pub-secret"), PEER) is None
    assert deferring.check(send("Orders", body=big), PEER)[0] == ResponseCode.NO_PERMISSION


def test_servers_hash_batch_bodies_inline_and_defer_only_huge_ones(tmp_path):
    # The hop to the worker thread costs as much CPU as hashing a 64 x 1 KiB batch (issue
    # 14's speed item): the broker's guard decides such a batch at once, and hands only
    # bodies of DEFER_SIGNATURE_BODY_BYTES_MIN and more to the worker.
    from types import SimpleNamespace

    from tidemq.acl.service import AclService
    from tidemq.acl.validator import DEFER_SIGNATURE_BODY_BYTES_MIN, PendingSignature

    service = AclService(write_acl(tmp_path))
    connection = SimpleNamespace(remote_address=PEER)
    batch = b"m" * (64 * 1088)  # a batch of 64 x 1 KiB messages with their headers
    assert service.guard(signed(send("Orders", body=batch), "publisher", "pub-secret"),
                         connection) is None
    wrong = service.guard(signed(send("Orders", body=batch), "publisher", "not-the-secret"),
                          connection)
    assert wrong[0] == ResponseCode.NO_PERMISSION and "does not match" in wrong[1]
    huge = b"m" * DEFER_SIGNATURE_BODY_BYTES_MIN
    verdict = service.guard(signed(send("Orders", body=huge), "publisher", "pub-secret"),
                            connection)
    assert isinstance(verdict, PendingSignature) and verdict.decide() is None
