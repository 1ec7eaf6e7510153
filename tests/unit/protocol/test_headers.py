"""Typed headers: extFields in, typed values out, and back, the way Java peers write them."""

import dataclasses
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import HeaderFieldError, RemoteProtocolError
from tidemq.protocol import headers
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.protocol.headers import (
    CreateTopicRequestHeader,
    EndTransactionRequestHeader,
    GetRouteInfoRequestHeader,
    PullMessageResponseHeader,
    QueryMessageRequestHeader,
    RegisterBrokerRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    read_pull_answer_numbers,
    read_request_header,
)

SEND_V1 = {
    "producerGroup": "pg", "topic": "Orders", "defaultTopic": "TBW102",
    "defaultTopicQueueNums": "4", "queueId": "2", "sysFlag": "0",
    "bornTimestamp": "1700000000000", "flag": "0", "properties": "TAGS\x01paid",
    "reconsumeTimes": "0", "unitMode": "false", "maxReconsumeTimes": "16", "batch": "false",
    "bname": "broker-a",
}
V1_TO_V2 = dict(zip(
    ["producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
     "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
     "batch", "bname"],
    "abcdefghijklmn",
    strict=True,
))
SEND_V2 = {V1_TO_V2[key]: value for key, value in SEND_V1.items()}


def test_send_header_reads_v1_and_v2_names_to_the_same_values():
    from_v1 = SendMessageRequestHeader.from_ext_fields(SEND_V1, RequestCode.SEND_MESSAGE)
    from_v2 = SendMessageRequestHeader.from_ext_fields(SEND_V2, RequestCode.SEND_MESSAGE_V2)
    assert from_v1 == from_v2
    assert from_v1.topic == "Orders"
    assert from_v1.queue_id == 2
    assert from_v1.born_timestamp == 1_700_000_000_000
    assert from_v1.max_reconsume_times == 16
    assert from_v1.broker_name == "broker-a"
    assert from_v1.unit_mode is False


def test_send_header_writes_back_exactly_what_java_sends():
    header = SendMessageRequestHeader.from_ext_fields(SEND_V2, RequestCode.SEND_BATCH_MESSAGE)
    assert header.to_ext_fields(v2=True) == SEND_V2
    assert header.to_ext_fields(v2=False) == SEND_V1


def test_send_header_form_is_guessed_without_a_code():
    assert SendMessageRequestHeader.from_ext_fields(SEND_V2).topic == "Orders"
    assert SendMessageRequestHeader.from_ext_fields(SEND_V1).topic == "Orders"


def test_send_v2_header_missing_topic_names_both_keys():
    ext = dict(SEND_V2)
    del ext["b"]
    with pytest.raises(HeaderFieldError) as caught:
        SendMessageRequestHeader.from_ext_fields(ext, RequestCode.SEND_MESSAGE_V2)
    assert "'b' (topic)" in str(caught.value)
    assert "missing" in str(caught.value)
    assert caught.value.field == "b"
    assert isinstance(caught.value, RemoteProtocolError)


def test_required_field_missing_raises_naming_header_and_field():
    with pytest.raises(HeaderFieldError, match=r"GetRouteInfoRequestHeader.*'topic' is missing"):
        GetRouteInfoRequestHeader.from_ext_fields({"acceptStandardJsonOnly": "true"})
    with pytest.raises(HeaderFieldError, match="'topic' is missing"):
        GetRouteInfoRequestHeader.from_ext_fields(None)


@pytest.mark.parametrize("text", ["4.0", "four", "", " 4", "1_000", "٤", "99999999999999999999"])
def test_integers_must_be_plain_decimal_integers(text):
    ext = {"topic": "T", "queueId": text}
    with pytest.raises(HeaderFieldError) as caught:
        headers.GetMaxOffsetRequestHeader.from_ext_fields(ext)
    assert caught.value.field == "queueId"
    if text:
        assert repr(text) in str(caught.value)


def test_integers_accept_signs_and_java_long_range():
    header = headers.GetMaxOffsetRequestHeader.from_ext_fields({"topic": "T", "queueId": "-1"})
    assert header.queue_id == -1
    header = headers.ViewMessageRequestHeader.from_ext_fields({"offset": "9223372036854775807"})
    assert header.offset == 2**63 - 1


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("TRUE", True), ("False", False), ("1", True), ("0", False)],
)
def test_booleans_read_in_any_case_and_as_c_plus_plus_digits(text, value):
    header = GetRouteInfoRequestHeader.from_ext_fields(
        {"topic": "T", "acceptStandardJsonOnly": text}
    )
    assert header.accept_standard_json_only is value


def test_unparsable_boolean_raises():
    with pytest.raises(HeaderFieldError, match="'acceptStandardJsonOnly' is 'yes'"):
        GetRouteInfoRequestHeader.from_ext_fields({"topic": "T", "acceptStandardJsonOnly": "yes"})


def test_empty_optional_number_counts_as_absent():
    header = headers.SendMessageRequestHeader.from_ext_fields(
        {**SEND_V2, "j": "", "l": ""}, RequestCode.SEND_MESSAGE_V2
    )
    assert header.reconsume_times is None
    assert header.max_reconsume_times is None


def test_unknown_ext_fields_are_ignored():
    ext = {"topic": "T", "AccessKey": "ak", "Signature": "sig", "OnsChannel": "ALIYUN",
           "bname": "b"}
    assert GetRouteInfoRequestHeader.from_ext_fields(ext) == GetRouteInfoRequestHeader(topic="T")


def test_to_ext_fields_omits_none_and_writes_java_booleans():
    header = EndTransactionRequestHeader(
        producer_group="pg", tran_state_table_offset=7, commit_log_offset=1024,
        commit_or_rollback=8, msg_id="ABC", from_transaction_check=True,
    )
    assert header.to_ext_fields() == {
        "producerGroup": "pg", "tranStateTableOffset": "7", "commitLogOffset": "1024",
        "commitOrRollback": "8", "fromTransactionCheck": "true", "msgId": "ABC",
    }


def test_special_java_names_are_used_on_the_wire():
    query = QueryMessageRequestHeader(
        topic="T", key="k", max_num=32, begin_timestamp=0, end_timestamp=1,
        unique_key_query=True,
    )
    assert query.to_ext_fields()["_UNIQUE_KEY_QUERY"] == "true"
    response = SendMessageResponseHeader(
        msg_id="AC", queue_id=1, queue_offset=5, msg_region="DefaultRegion", trace_on="true"
    )
    assert response.to_ext_fields() == {
        "msgId": "AC", "queueId": "1", "queueOffset": "5", "MSG_REGION": "DefaultRegion",
        "TRACE_ON": "true",
    }
    reset = headers.ResetOffsetRequestHeader(topic="T", group="g", timestamp=5, is_force=True)
    assert reset.to_ext_fields()["isForce"] == "true"


def test_optional_fields_take_their_defaults():
    header = CreateTopicRequestHeader.from_ext_fields({
        "topic": "T", "defaultTopic": "TBW102", "readQueueNums": "8", "writeQueueNums": "8",
        "perm": "6", "topicFilterType": "SINGLE_TAG",
    })
    assert header.order is False
    assert header.topic_sys_flag is None
    register = RegisterBrokerRequestHeader.from_ext_fields({
        "brokerName": "b", "brokerAddr": "1.2.3.4:10911", "clusterName": "c",
        "haServerAddr": "1.2.3.4:10912", "brokerId": "0",
    })
    assert register.compressed is False and register.body_crc32 == 0


def test_a_typed_header_travels_in_a_command_and_back():
    response_header = PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=42, min_offset=0, max_offset=100
    )
    command = RemotingCommand(code=19, flag=1, ext_fields=response_header.to_ext_fields())
    decoded = decode_command(command.encode()[4:])
    assert PullMessageResponseHeader.from_ext_fields(decoded.ext_fields) == response_header


def test_read_request_header_picks_the_class_by_code():
    header = read_request_header(RequestCode.SEND_MESSAGE_V2, SEND_V2)
    assert isinstance(header, SendMessageRequestHeader)
    assert read_request_header(RequestCode.HEART_BEAT, None) is None
    pull = read_request_header(RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": "3"})
    assert pull == headers.GetMinOffsetRequestHeader(topic="T", queue_id=3)


def test_every_header_class_round_trips_its_own_ext_fields():
    classes = {
        value for value in vars(headers).values()
        if isinstance(value, type) and issubclass(value, headers.Header)
        and value is not headers.Header
    }
    assert len(classes) >= 45
    samples = {str: "x", int: -7, bool: True, float: 0.5}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        values = {
            field.name: next(
                sample for kind, sample in samples.items()
                if kind in (hints[field.name], *typing.get_args(hints[field.name]))
            )
            for field in dataclasses.fields(cls)
        }
        instance = cls(**values)
        assert cls.from_ext_fields(instance.to_ext_fields()) == instance, cls.__name__


@given(
    st.integers(-(2**63), 2**63 - 1),
    st.text(st.characters(blacklist_categories=("Cs",))),
    st.booleans(),
)
def test_typed_values_round_trip_through_strings(offset, group, flag):
    header = headers.ConsumerSendMsgBackRequestHeader(
        offset=offset, group=group, delay_level=0, unit_mode=flag
    )
    assert headers.ConsumerSendMsgBackRequestHeader.from_ext_fields(header.to_ext_fields()) == (
        header
    )


PULL_ANSWER = {"suggestWhichBrokerId": "0", "nextBeginOffset": "1046",
               "minOffset": "0", "maxOffset": "123456789012345678"}


def test_a_pull_answer_s_numbers_read_directly_equal_the_typed_header_s():
    typed = PullMessageResponseHeader.from_ext_fields(PULL_ANSWER)
    assert read_pull_answer_numbers(PULL_ANSWER) == (
        typed.suggest_which_broker_id, typed.next_begin_offset, typed.min_offset,
        typed.max_offset) == (0, 1046, 0, 123456789012345678)
    assert read_pull_answer_numbers({**PULL_ANSWER, "bname": "broker-a"}) == (
        0, 1046, 0, 123456789012345678)  # other keys ignored, as the typed header does


@pytest.mark.parametrize("text", [
    "", "-1", "+1", " 1", "1 ", "1_0", "4.0", "\uff11", "\u00b2", "1234567890123456789",
    "9223372036854775808", "00000000000000000001", 7, None,
])
@pytest.mark.parametrize("key", sorted(PULL_ANSWER))
def test_a_pull_answer_s_other_texts_are_left_to_the_typed_header(key, text):
    fields = {**PULL_ANSWER, key: text}
    assert read_pull_answer_numbers(fields) is None
    missing = {name: value for name, value in PULL_ANSWER.items() if name != key}
    assert read_pull_answer_numbers(missing) is None
    assert read_pull_answer_numbers(None) is None


@given(st.lists(st.text(alphabet="0123456789+- _", max_size=20), min_size=4, max_size=4))
def test_a_pull_answer_s_numbers_agree_with_the_typed_header_whenever_read(texts):
    fields = dict(zip(sorted(PULL_ANSWER), texts, strict=True))
    numbers = read_pull_answer_numbers(fields)
    if numbers is None:
        return  # the typed header reads it (or names what is wrong), as before
    typed = PullMessageResponseHeader.from_ext_fields(fields)
    assert numbers == (typed.suggest_which_broker_id, typed.next_begin_offset,
                       typed.min_offset, typed.max_offset)
