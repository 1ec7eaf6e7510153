"""PullRequestReader reads every pull's extFields as PullMessageRequestHeader.from_ext_fields
does: the same header or the same error, whether its shape was seen before or not."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_paths import CLIENT_FRAMES_DIR
from tidemq.errors import HeaderFieldError
from tidemq.protocol.command import decode_command
from tidemq.protocol.headers import PullMessageRequestHeader
from tidemq.protocol.pull_request_reader import PULL_SHAPES_KEPT_MAX, PullRequestReader

VARYING = ("queueId", "queueOffset", "commitOffset")
SHAPES = [
    {"consumerGroup": "cg", "topic": "Orders", "maxMsgNums": "32", "sysFlag": "22",
     "suspendTimeoutMillis": "20000", "subscription": "*", "subVersion": "1795783990217",
     "expressionType": "TAG"},
    {"consumerGroup": "cg", "topic": "Orders", "maxMsgNums": "32", "sysFlag": "6",
     "suspendTimeoutMillis": "15000", "subVersion": "1795361014241"},  # no subscription
    {"consumerGroup": "cg2", "topic": "Orders", "maxMsgNums": "1024", "sysFlag": "2",
     "suspendTimeoutMillis": "20000", "subscription": "", "subVersion": "0",
     "expressionType": "SQL92", "bname": "broker-a"},
]
# What a field may hold on the wire or in a request built in process: plain decimals, the
# texts the general reader reads by its checked path or refuses, and values of other types.
ODD = [
    "", "007", "+5", "-0", "-1", " 4", "4.0", "\u0664", "9" * 18, "9" * 19, str(2**63),
    str(2**63 - 1), str(-(2**63)), "1023", "1024", "01023", "x", 5, -1, True, None, 4.0,
    ["1"], {"a": "1"},
]
plain_offsets = st.integers(0, 2**62).map(str) | st.integers(0, 1100).map(str)


class Text(str):
    """A str subclass: not a plain str to the fast paths."""


@st.composite
def pulls(draw) -> dict:
    """One pull's extFields: a known shape with new queue and offsets, now and then a field
    odd, missing, or the shape's texts changed."""
    ext = dict(draw(st.sampled_from(SHAPES)))
    ext["queueId"] = draw(st.integers(0, 1100).map(str))
    ext["queueOffset"] = draw(plain_offsets)
    ext["commitOffset"] = draw(plain_offsets | st.just("-1"))
    for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
        key = draw(st.sampled_from([*VARYING, *SHAPES[0]]))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            ext.pop(key, None)
        elif choice == 1:
            ext[key] = Text(ext.get(key) or "1")
        else:
            ext[key] = draw(st.sampled_from(ODD))
    return ext


def read_generally(ext):
    try:
        return "ok", PullMessageRequestHeader.from_ext_fields(ext)
    except HeaderFieldError as e:
        return "error", (e.field, str(e))


def read_by(reader: PullRequestReader, ext):
    try:
        return "ok", reader.read(ext)
    except HeaderFieldError as e:
        return "error", (e.field, str(e))


@settings(max_examples=80, deadline=None)
@given(st.lists(pulls(), min_size=1, max_size=6))
def test_a_reader_reads_every_pull_as_the_general_reader(sequence):
    reader = PullRequestReader()
    for ext in sequence:
        expected = read_generally(ext)
        assert read_by(reader, ext) == expected
        assert read_by(reader, ext) == expected  # its shape known now, if it was kept
        header = expected[1]
        if expected[0] == "ok":
            assert [type(getattr(reader.read(ext), name)) for name in header.__slots__] == [
                type(getattr(header, name)) for name in header.__slots__]


def test_a_known_shape_reads_the_new_queue_and_offsets():
    reader = PullRequestReader()
    ext = {**SHAPES[0], "queueId": "3", "queueOffset": "10", "commitOffset": "7"}
    first = reader.read(ext)
    later = reader.read({**ext, "queueId": "5", "queueOffset": "123456789012",
                         "commitOffset": "-1"})
    assert (first.queue_id, first.queue_offset, first.commit_offset) == (3, 10, 7)
    assert (later.queue_id, later.queue_offset, later.commit_offset) == (5, 123456789012, -1)
    assert later.consumer_group == "cg" and later.sub_version == 1795783990217
    assert later.subscription == "*" and later.expression_type == "TAG"
    assert later.sys_flag == 22 and later.suspend_timeout_millis == 20000


def test_an_odd_field_of_a_known_shape_is_refused_as_the_general_reader_refuses_it():
    reader = PullRequestReader()
    ext = {**SHAPES[0], "queueId": "3", "queueOffset": "10", "commitOffset": "0"}
    reader.read(ext)
    with pytest.raises(HeaderFieldError) as caught:
        reader.read({**ext, "queueOffset": "ten"})
    assert caught.value.field == "queueOffset" and "'ten'" in str(caught.value)
    with pytest.raises(HeaderFieldError) as caught:
        reader.read({**ext, "queueId": ""})
    assert caught.value.field == "queueId"
    with pytest.raises(HeaderFieldError):
        reader.read(None)


def test_the_shapes_kept_are_bounded():
    reader = PullRequestReader()
    base = {**SHAPES[0], "queueId": "0", "queueOffset": "0", "commitOffset": "0"}
    for version in range(PULL_SHAPES_KEPT_MAX + 10):
        header = reader.read({**base, "subVersion": str(version)})
        assert header.sub_version == version
        assert len(reader._shapes) <= PULL_SHAPES_KEPT_MAX


PULL_FRAMES = sorted(CLIENT_FRAMES_DIR.glob("*/*_c2s_code11.bin"))


def test_the_pull_frames_are_there():
    assert len(PULL_FRAMES) >= 20, f"expected captured pulls under {CLIENT_FRAMES_DIR}"


@pytest.mark.parametrize("path", PULL_FRAMES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_pulls_other_clients_sent_read_as_the_general_reader(path):
    ext = decode_command(path.read_bytes()[4:]).ext_fields
    reader = PullRequestReader()
    expected = PullMessageRequestHeader.from_ext_fields(ext)
    assert reader.read(ext) == expected
    assert reader.read(dict(ext)) == expected  # the shape known
