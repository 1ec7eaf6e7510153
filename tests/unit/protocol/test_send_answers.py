"""A group's send answers encoded from columns: the very bytes the general encoder writes."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.protocol.codes import FLAG_RESPONSE, TIDEMQ_VERSION, LanguageCode, ResponseCode
from tidemq.protocol.command import RemotingCommand, decode_command
from tidemq.protocol.send_answers import encode_offset_send_answers, encode_send_answers

INT32 = st.integers(-(2**31), 2**31 - 1)
MSG_ID = st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32)


def one_by_one(opaques, msg_ids, queue_ids, queue_offsets, region, trace_on, version):
    """What the send processor and the dispatcher write for each answer (send_processor.py
    ``_response``, dispatch.py ``_encoded_answer``)."""
    frames = []
    for opaque, msg_id, queue_id, queue_offset in zip(
            opaques, msg_ids, queue_ids, queue_offsets, strict=True):
        ext_fields = {"MSG_REGION": region, "TRACE_ON": "true" if trace_on else "false",
                      "msgId": msg_id, "queueId": str(queue_id),
                      "queueOffset": str(queue_offset)}
        response = RemotingCommand(int(ResponseCode.SUCCESS), opaque, FLAG_RESPONSE, None,
                                   ext_fields, None, LanguageCode.PYTHON, version)
        frames.append(response.encode())
    return b"".join(frames)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(INT32, MSG_ID, st.integers(0, 1023), st.integers(0, 2**62)),
                  min_size=1, max_size=40),
    region=st.text(max_size=20),
    trace_on=st.booleans(),
    version=INT32,
)
def test_columns_encode_the_bytes_of_the_one_by_one_answers(rows, region, trace_on, version):
    opaques, msg_ids, queue_ids, queue_offsets = (
        list(column) for column in zip(*rows, strict=True))
    encoded = encode_send_answers(opaques, msg_ids, queue_ids, queue_offsets, region=region,
                                  trace_on=trace_on, version=version)
    assert encoded == one_by_one(opaques, msg_ids, queue_ids, queue_offsets, region, trace_on,
                                 version)


def test_each_frame_decodes_as_its_own_response():
    encoded = encode_send_answers([7, 8], ["AB" * 16, "CD" * 16], [0, 3], [10, 11],
                                  region='Def"ault%sRegion\u00e9', trace_on=False,
                                  version=TIDEMQ_VERSION)
    assert encoded is not None
    first_length = int.from_bytes(encoded[:4], "big")
    first = decode_command(encoded[4:4 + first_length])
    second = decode_command(encoded[8 + first_length:])
    assert (first.opaque, second.opaque) == (7, 8)
    assert first.is_response and first.code == ResponseCode.SUCCESS and first.remark is None
    assert second.ext_fields == {"MSG_REGION": 'Def"ault%sRegion\u00e9', "TRACE_ON": "false",
                                 "msgId": "CD" * 16, "queueId": "3", "queueOffset": "11"}


def test_values_the_template_cannot_write_as_they_are_are_declined():
    # A msg id needing JSON escapes, or an opaque outside int32: the caller encodes those
    # one by one, through the general encoder that checks (or names) each value.
    assert encode_send_answers([1], ['A"B'], [0], [0], region="r", trace_on=True,
                               version=1) is None
    assert encode_send_answers([2**31], ["AB"], [0], [0], region="r", trace_on=True,
                               version=1) is None
    assert encode_send_answers([], [], [], [], region="r", trace_on=True, version=1) == b""
    assert encode_send_answers([1], ["AB"], [0], [0], region="\ud800", trace_on=True,
                               version=1) is None


HOST = st.text(alphabet="0123456789ABCDEF", min_size=16, max_size=16)


@settings(max_examples=150, deadline=None)
@given(
    host=HOST,
    rows=st.lists(st.tuples(INT32, st.integers(0, 2**63 - 1), st.integers(0, 1023),
                            st.integers(0, 2**62)), min_size=1, max_size=40),
    region=st.text(max_size=20),
    trace_on=st.booleans(),
    version=INT32,
)
def test_offset_msg_ids_encode_the_bytes_of_the_one_by_one_answers(
        host, rows, region, trace_on, version):
    # The store's offset msg id: the host's part, then the offset as 16 uppercase hex digits.
    opaques, offsets, queue_ids, queue_offsets = (
        list(column) for column in zip(*rows, strict=True))
    msg_ids = [f"{host}{offset:016X}" for offset in offsets]
    encoded = encode_offset_send_answers(opaques, host, offsets, queue_ids, queue_offsets,
                                         region=region, trace_on=trace_on, version=version)
    assert encoded == one_by_one(opaques, msg_ids, queue_ids, queue_offsets, region, trace_on,
                                 version)


def test_offset_answers_decline_what_the_template_cannot_write():
    answer = functools.partial(encode_offset_send_answers, region="r%s", trace_on=True,
                               version=1)
    assert answer([1], "7F000001%00027AF", [0], [0], [0]) is None  # a host part with a %
    assert answer([1], "7F00000100002A9F", [-1], [0], [0]) is None
    assert answer([1], "7F00000100002A9F", [2**63], [0], [0]) is None
    assert answer([2**31], "7F00000100002A9F", [0], [0], [0]) is None
    assert answer([], "7F00000100002A9F", [], [], []) == b""
    assert answer([5], "7F00000100002A9F", [255], [2], [3]) == one_by_one(
        [5], ["7F00000100002A9F00000000000000FF"], [2], [3], "r%s", True, 1)
