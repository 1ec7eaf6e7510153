"""The tolerant JSON codec reads what fastjson writes and writes what fastjson would."""

import enum

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import LocalProtocolError, RemoteProtocolError
from tidemq.protocol.jsonx import (
    JSON_DEPTH_MAX,
    JsonDecodeError,
    JsonEncodeError,
    JsonObjectKey,
    dumps,
    loads,
)

# Shapes from docs/protocol.md §5.2, §5.3 and §5 (captured from Java name servers and brokers).
ROUTE_DATA_PRE_494 = (
    b'{"brokerDatas":[{"brokerAddrs":{0:"172.16.0.1:10911"},"brokerName":"broker-a",'
    b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a",'
    b'"perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
)
CLUSTER_INFO = (
    b'{"brokerAddrTable":{"b1":{"brokerAddrs":{0:"172.16.16.37:10911",1:"172.16.16.38:10911"},'
    b'"brokerName":"b1","cluster":"c1"}},"clusterAddrTable":{"c1":["b1"]}}'
)
TOPIC_STATS = (
    b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:'
    b'{"lastUpdateTimestamp":0,"maxOffset":0,"minOffset":0}}}'
)


# -- reading ------------------------------------------------------------------------------------


def test_standard_json_reads_like_orjson():
    text = b'{"a":[1,2.5,"x",true,false,null],"b":{"c":{}},"d":"\\u00e9\\n"}'
    assert loads(text) == orjson.loads(text)


def test_unquoted_integer_keys_read_as_int():
    route = loads(ROUTE_DATA_PRE_494)
    assert route["brokerDatas"][0]["brokerAddrs"] == {0: "172.16.0.1:10911"}
    assert route["queueDatas"][0]["writeQueueNums"] == 4

    cluster = loads(CLUSTER_INFO)
    assert cluster["brokerAddrTable"]["b1"]["brokerAddrs"] == {
        0: "172.16.16.37:10911",
        1: "172.16.16.38:10911",
    }
    assert cluster["clusterAddrTable"] == {"c1": ["b1"]}


def test_negative_and_spaced_integer_keys():
    assert loads('{ -1 : "a" ,\n\t2:"b" }') == {-1: "a", 2: "b"}


def test_quoted_integer_keys_stay_strings():
    assert loads(b'{"0":"a",1:"b"}') == {"0": "a", 1: "b"}


def test_fastjson_pretty_file_with_tabs_and_unquoted_keys():
    text = '{\n\t"offsetTable":{\n\t\t"T@g":{\n\t\t\t0:125,\n\t\t\t1:130\n\t\t}\n\t}\n}'
    assert loads(text) == {"offsetTable": {"T@g": {0: 125, 1: 130}}}


def test_object_keys_read_as_hashable_json_object_keys():
    stats = loads(TOPIC_STATS)
    ((key, value),) = stats["offsetTable"].items()
    assert isinstance(key, JsonObjectKey)
    assert key.get("topic") == "t"
    assert key.get("queueId") == 0
    assert key.get("missing", "default") == "default"
    assert key.as_dict() == {"brokerName": "b", "queueId": 0, "topic": "t"}
    assert value == {"lastUpdateTimestamp": 0, "maxOffset": 0, "minOffset": 0}
    # Field order does not matter: a key built in any order finds the entry.
    lookup = JsonObjectKey({"topic": "t", "queueId": 0, "brokerName": "b"})
    assert stats["offsetTable"][lookup] == value
    assert list(lookup.keys()) == ["brokerName", "queueId", "topic"]


def test_nested_values_in_object_keys_are_frozen_and_thawed():
    data = loads('{{"a":{"b":[1,2]},"c":null}:1}')
    (key,) = data
    assert hash(key) == hash(JsonObjectKey({"c": None, "a": {"b": [1, 2]}}))
    assert key.as_dict() == {"a": {"b": [1, 2]}, "c": None}


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, str])
def test_every_input_type_reads(kind):
    data = CLUSTER_INFO if kind is not str else CLUSTER_INFO.decode()
    assert loads(kind(data))["clusterAddrTable"] == {"c1": ["b1"]}


def test_non_ascii_text_in_tolerant_input():
    assert loads('{0:"héllo ✓ 😀"}'.encode()) == {0: "héllo ✓ 😀"}


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("", 0),
        ("   ", 3),
        ("{0:1", 4),
        ('{"a" 1}', 5),
        ("[1,]", 3),
        ("{a:1}", 1),
        ('{0:"x",}', 7),
        ("[1] x", 4),
        ("{0:1}{", 5),
        ("{0:01}", 4),
        ("{0:1.}", 4),
        ("{0:NaN}", 3),
        ("{0:tru}", 3),
        ("{0:1e999}", 3),
        ('{0:"abc}', 3),
        ('{0:"a\x01b"}', 5),
        ("{[1]:2}", 1),
    ],
)
def test_malformed_input_raises_naming_the_position(text, position):
    with pytest.raises(JsonDecodeError) as caught:
        loads(text)
    assert caught.value.position == position
    assert f"character {position}" in str(caught.value)
    assert isinstance(caught.value, RemoteProtocolError)


def test_invalid_utf8_raises_naming_the_byte():
    with pytest.raises(JsonDecodeError, match="UTF-8 at byte 4"):
        loads(b'{0:"\xff"}')


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "[" * 100_000 + "]" * 100_000,
        "{0:" * 50_000,
        "{{" * 50_000,
        "[" * 2000 + "{0:1}" + "]" * 2000,
    ],
)
def test_deep_nesting_raises_decode_error_not_recursion_error(text):
    with pytest.raises(JsonDecodeError, match="JSON_DEPTH_MAX"):
        loads(text)


def test_nesting_up_to_the_limit_reads():
    depth = JSON_DEPTH_MAX
    text = "[" * (depth - 1) + "{0:1}" + "]" * (depth - 1)
    value = loads(text)
    for _ in range(depth - 1):
        (value,) = value
    assert value == {0: 1}


# -- writing ------------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1


class Mode(enum.IntEnum):
    CLUSTERING = 7


class Where(enum.StrEnum):
    LAST = "last"


class MessageQueue:
    """A user type that writes itself as a map key, like Java's MessageQueue."""

    def __init__(self, topic, broker_name, queue_id):
        self.topic, self.broker_name, self.queue_id = topic, broker_name, queue_id

    def to_json_key(self):
        return {"topic": self.topic, "brokerName": self.broker_name, "queueId": self.queue_id}


def test_keys_sorted_and_nulls_kept():
    assert dumps({"b": 1, "a": None, "c": [3, {"z": 1, "y": 2}]}) == (
        b'{"a":null,"b":1,"c":[3,{"y":2,"z":1}]}'
    )


def test_sort_keys_false_keeps_insertion_order():
    assert dumps({"b": 1, "a": 2}, sort_keys=False) == b'{"b":1,"a":2}'


def test_int_keys_quoted_by_default_and_bare_on_request():
    table = {"offsetTable": {"T@g": {0: 125, 1: 130}}}
    assert dumps(table) == b'{"offsetTable":{"T@g":{"0":125,"1":130}}}'
    assert dumps(table, unquoted_int_keys=True) == b'{"offsetTable":{"T@g":{0:125,1:130}}}'


def test_enums_are_written_by_name_as_values_and_keys():
    value = {"a": Color.RED, "b": [Mode.CLUSTERING], "c": Where.LAST, Mode.CLUSTERING: 1}
    assert dumps(value) == b'{"CLUSTERING":1,"a":"RED","b":["CLUSTERING"],"c":"LAST"}'


def test_object_keys_written_as_json_objects():
    table = {
        MessageQueue("t", "b", 1): {"maxOffset": 9},
        JsonObjectKey({"topic": "t", "queueId": 0, "brokerName": "b"}): {"maxOffset": 5},
    }
    expected = (
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"maxOffset":5},'
        b'{"brokerName":"b","queueId":1,"topic":"t"}:{"maxOffset":9}}}'
    )
    assert dumps({"offsetTable": table}) == expected


def test_fastjson_bodies_round_trip_byte_for_byte():
    for body in (ROUTE_DATA_PRE_494, CLUSTER_INFO, TOPIC_STATS):
        assert dumps(loads(body), unquoted_int_keys=True) == body


def test_pretty_layout_matches_orjson_indent_2_on_both_paths():
    plain = {"b": [1, {"c": None}], "a": {}, "d": [], "e": "x"}
    expected = orjson.dumps(plain, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    assert dumps(plain, pretty=True) == expected
    with_enum = {**plain, "e": Where.LAST}
    assert dumps(with_enum, pretty=True) == expected.replace(b'"x"', b'"LAST"')


def test_pretty_object_keys_are_compact():
    table = {JsonObjectKey({"topic": "t", "queueId": 0}): 5}
    assert dumps(table, pretty=True) == b'{\n  {"queueId":0,"topic":"t"}: 5\n}'


def test_python_writer_escapes_strings_like_orjson():
    text = "".join(map(chr, range(0x80))) + "\x7f é ✓ 😀 \u2028 \ufeff"
    for pretty in (False, True):
        option = orjson.OPT_SORT_KEYS | (orjson.OPT_INDENT_2 if pretty else 0)
        expected = orjson.dumps({text: [text, -(2**63), 2**64 - 1, 1e-7, 2.5]}, option=option)
        assert dumps(PlainDict({text: [text, -(2**63), 2**64 - 1, 1e-7, 2.5]}), pretty=pretty) == (
            expected
        )


def test_unwritable_values_raise_encode_error():
    with pytest.raises(JsonEncodeError, match="dict key of type"):
        dumps({(1, 2): "tuple keys are not JSON"})
    with pytest.raises(JsonEncodeError, match="64-bit"):
        dumps({"big": 1 << 70})
    with pytest.raises(JsonEncodeError, match="64-bit"):
        dumps({"big": 1 << 70, "e": Color.RED})
    with pytest.raises(JsonEncodeError):
        dumps({"set": {1, 2}})
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(JsonEncodeError):
        dumps(cycle)
    cycle_with_enum: list = [Color.RED]
    cycle_with_enum.append(cycle_with_enum)
    with pytest.raises(JsonEncodeError, match="JSON_DEPTH_MAX"):
        dumps(cycle_with_enum)
    assert issubclass(JsonEncodeError, LocalProtocolError)


# -- properties ---------------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
plain_json = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
fastjson_keys = (
    st.text(max_size=6)
    | st.integers(min_value=-(2**31), max_value=2**31 - 1)
    | st.dictionaries(st.text(max_size=4), scalars, min_size=1, max_size=3).map(JsonObjectKey)
)
fastjson_json = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(fastjson_keys, children, max_size=4)
    ),
    max_leaves=20,
)


class PlainDict(dict):
    """A dict subclass takes the Python writer instead of orjson's fast path."""


@settings(max_examples=200, deadline=None)
@given(plain_json, st.booleans())
def test_python_writer_matches_orjson_fast_path(value, pretty):
    assert dumps(PlainDict(v=value), pretty=pretty) == dumps({"v": value}, pretty=pretty)


@settings(max_examples=200, deadline=None)
@given(plain_json)
def test_tolerant_parser_reads_standard_json_like_orjson(value):
    # The unquoted key sends the whole document down the tolerant parser.
    text = b'{0:1,"v":' + orjson.dumps(value) + b"}"
    assert loads(text) == {0: 1, "v": value}


@settings(max_examples=200, deadline=None)
@given(fastjson_json, st.booleans())
def test_fastjson_form_round_trips(value, pretty):
    assert loads(dumps(value, pretty=pretty, unquoted_int_keys=True)) == value
