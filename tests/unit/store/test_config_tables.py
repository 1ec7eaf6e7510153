"""The four config tables: RocketMQ's JSON shapes, round trips, versions, persistence."""

import logging
from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import ConfigFileCorrupt
from tidemq.protocol import jsonx
from tidemq.protocol.jsonx import JsonDecodeError, JsonShapeError
from tidemq.store.config_file import ConfigFile
from tidemq.store.config_tables import (
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupTable,
    TopicConfig,
    TopicConfigTable,
)

# Files as a RocketMQ 4.x broker writes them (docs/protocol.md §10.6): fastjson, pretty, tabs,
# integer keys unquoted.
ROCKETMQ_TOPICS = b"""{
\t"dataVersion":{
\t\t"counter":3,
\t\t"timestamp":1700000000000
\t},
\t"topicConfigTable":{
\t\t"TopicTest":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TopicTest",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":4
\t\t},
\t\t"SCHEDULE_TOPIC_XXXX":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":18,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"SCHEDULE_TOPIC_XXXX",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":18
\t\t}
\t}
}"""
ROCKETMQ_OFFSETS = (
    b'{"offsetTable":{"TopicTest@group1":{0:125,1:130,2:128,3:127},"%RETRY%group1@group1":{0:0}}}'
)
ROCKETMQ_GROUPS = (
    b'{"dataVersion":{"counter":1,"timestamp":1700000000001},"subscriptionGroupTable":'
    b'{"group1":{"brokerId":0,"consumeBroadcastEnable":true,"consumeEnable":true,'
    b'"consumeFromMinEnable":true,"groupName":"group1","notifyConsumerIdsChangedEnable":true,'
    b'"retryMaxTimes":16,"retryQueueNums":1,"whichBrokerWhenConsumeSlowly":1}}}'
)
ROCKETMQ_DELAY = b'{"offsetTable":{1:0,2:5,3:12}}'


# -- reading RocketMQ's files -------------------------------------------------------------------


def test_rocketmq_topics_file_loads(tmp_path):
    path = tmp_path / "topics.json"
    path.write_bytes(ROCKETMQ_TOPICS)
    table = TopicConfigTable.load(path)
    assert table.data_version == DataVersion(counter=3, timestamp_ms=1_700_000_000_000)
    assert table.get("TopicTest") == TopicConfig("TopicTest", 4, 4, 6, "SINGLE_TAG", 0, False)
    assert table.get("SCHEDULE_TOPIC_XXXX").read_queue_nums == 18
    assert sorted(table.topic_names()) == ["SCHEDULE_TOPIC_XXXX", "TopicTest"]


def test_rocketmq_offsets_file_with_unquoted_keys_loads(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(ROCKETMQ_OFFSETS)
    table = ConsumerOffsetTable.load(path)
    assert table.query("group1", "TopicTest", 1) == 130
    assert table.offsets_of("group1", "TopicTest") == {0: 125, 1: 130, 2: 128, 3: 127}
    assert table.query("group1", "%RETRY%group1", 0) == 0


def test_rocketmq_groups_and_delay_files_load(tmp_path):
    (tmp_path / "subscriptionGroup.json").write_bytes(ROCKETMQ_GROUPS)
    (tmp_path / "delayOffset.json").write_bytes(ROCKETMQ_DELAY)
    groups = SubscriptionGroupTable.load(tmp_path / "subscriptionGroup.json")
    assert groups.get("group1") == SubscriptionGroupConfig("group1")
    assert groups.data_version.counter == 1
    delay = DelayOffsetTable.load(tmp_path / "delayOffset.json")
    assert [(level, delay.query(level)) for level in delay.levels()] == [(1, 0), (2, 5), (3, 12)]


def test_quoted_and_unquoted_keys_read_the_same():
    quoted = ConsumerOffsetTable.from_json(b'{"offsetTable":{"T@g":{"0":5,"1":6}}}')
    unquoted = ConsumerOffsetTable.from_json(b'{"offsetTable":{"T@g":{0:5,1:6}}}')
    assert quoted.offsets_of("g", "T") == unquoted.offsets_of("g", "T") == {0: 5, 1: 6}
    assert DelayOffsetTable.from_json(b'{"offsetTable":{"2":7}}').query(2) == 7


def test_unknown_fields_from_newer_brokers_are_ignored():
    body = (
        b'{"dataVersion":{"counter":1,"timestamp":2,"stateVersion":0},"topicConfigTable":{"T":'
        b'{"topicName":"T","attributes":{"message.type":"NORMAL"},"readQueueNums":2}}}'
    )
    assert TopicConfigTable.from_json(body).get("T") == TopicConfig("T", read_queue_nums=2)


# -- writing the exact shapes -------------------------------------------------------------------


def test_topic_table_json_shape():
    table = TopicConfigTable(
        [TopicConfig("TopicTest", 4, 4)], DataVersion(counter=3, timestamp_ms=1_700_000_000_000)
    )
    assert table.to_json() == (
        b'{"dataVersion":{"counter":3,"timestamp":1700000000000},"topicConfigTable":{"TopicTest":'
        b'{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
        b'"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}'
    )


def test_subscription_group_json_shape_has_rocketmq_defaults():
    table = SubscriptionGroupTable(
        [SubscriptionGroupConfig("group1")], DataVersion(counter=1, timestamp_ms=1_700_000_000_001)
    )
    assert table.to_json() == ROCKETMQ_GROUPS


def test_offset_tables_write_quoted_integer_keys():
    offsets = ConsumerOffsetTable.from_json(ROCKETMQ_OFFSETS)
    written = offsets.to_json()
    assert written == (
        b'{"offsetTable":{"%RETRY%group1@group1":{"0":0},'
        b'"TopicTest@group1":{"0":125,"1":130,"2":128,"3":127}}}'
    )
    assert orjson.loads(written)  # standard JSON
    assert DelayOffsetTable.from_json(ROCKETMQ_DELAY).to_json() == (
        b'{"offsetTable":{"1":0,"2":5,"3":12}}'
    )


def test_saved_files_are_pretty_standard_json(tmp_path):
    table = DelayOffsetTable({1: 3})
    table.save(tmp_path / "delayOffset.json")
    text = (tmp_path / "delayOffset.json").read_bytes()
    assert text == b'{\n  "offsetTable": {\n    "1": 3\n  }\n}'


# -- round trips --------------------------------------------------------------------------------


def sample_topics():
    return TopicConfigTable(
        [
            TopicConfig("Orders", 8, 8, 6, "MULTI_TAG", 1, True),
            TopicConfig("%RETRY%cg", 1, 1),
            TopicConfig("TBW102", perm=7),
        ],
        DataVersion(counter=9, timestamp_ms=123),
    )


def sample_groups():
    return SubscriptionGroupTable(
        [
            SubscriptionGroupConfig("cg"),
            SubscriptionGroupConfig(
                "slow",
                consume_enable=False,
                consume_from_min_enable=False,
                consume_broadcast_enable=False,
                retry_queue_nums=3,
                retry_max_times=2,
                broker_id=1,
                which_broker_when_consume_slowly=0,
                notify_consumer_ids_changed_enable=False,
            ),
        ],
        DataVersion(counter=2, timestamp_ms=456),
    )


def sample_offsets():
    table = ConsumerOffsetTable()
    table.commit("cg", "Orders", 0, 10)
    table.commit("cg", "Orders", 1, 11)
    table.commit("cg", "%RETRY%cg", 0, 0)
    table.commit("other", "Orders", 3, 99)
    return table


def sample_delay():
    return DelayOffsetTable({1: 0, 3: 12, 18: 400})


def same_topics(a, b):
    by_name = {c.topic_name: c for c in a}, {c.topic_name: c for c in b}
    return by_name[0] == by_name[1] and a.data_version == b.data_version


def same_groups(a, b):
    by_name = {c.group_name: c for c in a}, {c.group_name: c for c in b}
    return by_name[0] == by_name[1] and a.data_version == b.data_version


def same_offsets(a, b):
    return a.to_json_object() == b.to_json_object()


def same_delay(a, b):
    return [(x, a.query(x)) for x in a.levels()] == [(x, b.query(x)) for x in b.levels()]


TABLES = [
    (TopicConfigTable, sample_topics, same_topics),
    (SubscriptionGroupTable, sample_groups, same_groups),
    (ConsumerOffsetTable, sample_offsets, same_offsets),
    (DelayOffsetTable, sample_delay, same_delay),
]


@pytest.mark.parametrize(("cls", "make", "same"), TABLES, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("pretty", [False, True])
def test_json_round_trip(cls, make, same, pretty):
    table = make()
    assert same(cls.from_json(table.to_json(pretty=pretty)), table)


@pytest.mark.parametrize(("cls", "make", "same"), TABLES, ids=lambda v: getattr(v, "__name__", ""))
def test_save_and_load_round_trip(tmp_path, cls, make, same):
    path = cls.path_in(tmp_path)
    assert path == tmp_path / "config" / cls.file_name
    table = make()
    table.save(path)
    assert same(cls.load(path), table)
    assert same(cls.load(ConfigFile(path)), table)


@pytest.mark.parametrize(("cls", "make", "same"), TABLES, ids=lambda v: getattr(v, "__name__", ""))
def test_missing_file_loads_an_empty_table(tmp_path, cls, make, same):
    assert len(cls.load(cls.path_in(tmp_path))) == 0


# -- versions and operations --------------------------------------------------------------------


def test_topic_changes_bump_the_data_version():
    table = TopicConfigTable()
    version = table.data_version.counter
    table.put(TopicConfig("T", 4, 4))
    assert table.data_version.counter == version + 1
    table.put(TopicConfig("T", 4, 4))  # no change, no bump
    assert table.data_version.counter == version + 1
    table.put(replace(table.get("T"), perm=4))
    assert table.data_version.counter == version + 2
    assert table.get("T").perm == 4
    assert table.remove("T").perm == 4
    assert table.remove("T") is None
    assert table.data_version.counter == version + 3
    assert "T" not in table


def test_group_changes_bump_the_data_version():
    table = SubscriptionGroupTable()
    table.put(SubscriptionGroupConfig("cg"))
    table.put(SubscriptionGroupConfig("cg"))
    table.put(SubscriptionGroupConfig("cg", retry_max_times=3))
    assert table.data_version.counter == 2
    assert table.get("cg").retry_max_times == 3
    assert table.group_names() == ["cg"]
    table.remove("cg")
    assert table.data_version.counter == 3 and len(table) == 0


def test_consumer_offsets_commit_query_and_remove():
    table = sample_offsets()
    assert table.query("cg", "Orders", 1) == 11
    assert table.query("cg", "Orders", 2) is None
    assert table.query("nobody", "Orders", 0) is None
    assert table.offsets_of_group("cg") == {"Orders": {0: 10, 1: 11}, "%RETRY%cg": {0: 0}}
    assert table.topics_of_group("cg") == {"Orders", "%RETRY%cg"}
    assert table.groups_of_topic("Orders") == {"cg", "other"}

    counter = table.data_version.counter
    table.commit("cg", "Orders", 1, 11)  # unchanged
    assert table.data_version.counter == counter
    table.commit("cg", "Orders", 1, 20)
    assert table.data_version.counter == counter + 1
    assert table.query("cg", "Orders", 1) == 20

    assert table.remove_topic("Orders") == 2
    assert table.groups_of_topic("Orders") == set()
    assert table.query("cg", "%RETRY%cg", 0) == 0
    assert table.remove_group("cg") == 1
    assert table.offsets_of_group("cg") == {}
    assert table.remove_group("cg") == 0


def test_delay_offsets_commit_and_query():
    table = DelayOffsetTable()
    table.commit(3, 7)
    table.commit(3, 7)
    assert table.data_version.counter == 1
    assert table.query(3) == 7 and table.query(4) is None
    with pytest.raises(ValueError, match="delay level 0"):
        table.commit(0, 1)


# -- bad shapes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "body", "names"),
    [
        (TopicConfigTable, b'{"topicConfigTable":{"T":{"readQueueNums":"4"}}}', "readQueueNums"),
        (TopicConfigTable, b'{"topicConfigTable":{"T":{"order":1}}}', "order"),
        (TopicConfigTable, b'{"topicConfigTable":{"T":{"topicFilterType":"X"}}}', "SINGLE_TAG"),
        (TopicConfigTable, b'{"topicConfigTable":{"T":{"topicName":"U"}}}', "'U'"),
        (TopicConfigTable, b'{"topicConfigTable":[]}', "topicConfigTable"),
        (TopicConfigTable, b'{"dataVersion":{"counter":true}}', "dataVersion.counter"),
        (TopicConfigTable, b"[]", "topic config table"),
        (SubscriptionGroupTable, b'{"subscriptionGroupTable":{"g":{"brokerId":null}}}', "brokerId"),
        (ConsumerOffsetTable, b'{"offsetTable":{"T@g":{"x":1}}}', "'x'"),
        (ConsumerOffsetTable, b'{"offsetTable":{"T@g":{"0":1.5}}}', "1.5"),
        (ConsumerOffsetTable, b'{"offsetTable":{"T@g":[1]}}', "T@g"),
        (DelayOffsetTable, b'{"offsetTable":{"0":1}}', "delay level 0"),
    ],
)
def test_wrong_shapes_raise_naming_the_field(cls, body, names):
    with pytest.raises(JsonShapeError) as caught:
        cls.from_json(body)
    assert names in str(caught.value)


def test_not_json_raises_decode_error():
    with pytest.raises(JsonDecodeError):
        TopicConfigTable.from_json(b"{oops")


def test_file_of_the_wrong_shape_falls_back_to_bak(tmp_path, caplog):
    path = TopicConfigTable.path_in(tmp_path)
    sample_topics().save(path)
    TopicConfigTable().save(path)  # the sample is now the .bak
    path.write_bytes(b'{"topicConfigTable":{"T":{"perm":"rw"}}}')
    with caplog.at_level(logging.WARNING, logger="tidemq.store.config_file"):
        table = TopicConfigTable.load(path)
    assert same_topics(table, sample_topics())
    assert "perm" in caplog.text


def test_both_files_bad_raises_config_file_corrupt(tmp_path):
    path = ConsumerOffsetTable.path_in(tmp_path)
    sample_offsets().save(path)
    sample_offsets().save(path)
    path.write_bytes(b"garbage")
    path.with_name(path.name + ".bak").write_bytes(b'{"offsetTable":{"T@g":{"0":"x"}}}')
    with pytest.raises(ConfigFileCorrupt, match=r"consumerOffset\.json"):
        ConsumerOffsetTable.load(path)


# -- the saved file from cached entries ---------------------------------------------------------

_NAMES = st.text(alphabet="abAB%_-09é日", min_size=1, max_size=6)


@given(st.lists(st.tuples(st.sampled_from(["put", "remove", "save"]), _NAMES,
                          st.integers(1, 16)), max_size=60))
@settings(max_examples=60, deadline=None)
def test_pretty_file_from_cached_entries_is_what_the_writer_writes(changes):
    # Saves join per-entry text cached across saves; every change in any order must still
    # give the exact bytes of a whole-table write (RocketMQ's shape, keys sorted).
    topics, groups = TopicConfigTable(), SubscriptionGroupTable()
    for action, name, number in changes:
        if action == "put":
            topics.put(TopicConfig(name, number, number))
            groups.put(SubscriptionGroupConfig(name, retry_max_times=number))
        elif action == "remove":
            topics.remove(name)
            groups.remove(name)
        for table in (topics, groups):
            assert table.to_json(pretty=True) == jsonx.dumps(table.to_json_object(), pretty=True)


def test_a_save_reserializes_only_the_changed_entry(monkeypatch):
    table = TopicConfigTable([TopicConfig(f"T{i}", 4, 4) for i in range(100)])
    table.to_json(pretty=True)
    serialized: list[str] = []
    real = TopicConfig.to_json_object

    def counting(self):
        serialized.append(self.topic_name)
        return real(self)

    monkeypatch.setattr(TopicConfig, "to_json_object", counting)
    table.put(TopicConfig("T5", 8, 8))
    table.put(TopicConfig("New", 1, 1))
    data = table.to_json(pretty=True)
    assert sorted(serialized) == ["New", "T5"]
    monkeypatch.undo()
    assert data == jsonx.dumps(table.to_json_object(), pretty=True)
