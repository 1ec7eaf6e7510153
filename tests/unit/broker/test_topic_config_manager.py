"""TopicConfigManager: built-in topics, topics.json, and the topic creation rules of §11.3."""

from __future__ import annotations

import json

import pytest

from tidemq.broker.config import PERM_INHERIT, PERM_READ, PERM_WRITE, BrokerConfig
from tidemq.broker.topic_config_manager import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    TopicConfig,
    TopicConfigManager,
    is_not_allowed_send_topic,
)


@pytest.fixture
def config_dir(tmp_path):
    return tmp_path / "config"


def manager(config_dir, changes=None, **overrides):
    return TopicConfigManager(
        BrokerConfig(**overrides),
        config_dir,
        on_change=(lambda topics: changes.append(1)) if changes is not None else None,
    )


def test_built_in_topics_of_every_broker(config_dir):
    topics = manager(config_dir, broker_cluster_name="C1", broker_name="b1").all()
    assert topics["TBW102"].perm == PERM_INHERIT | PERM_READ | PERM_WRITE
    assert topics["TBW102"].write_queue_nums == 8
    assert topics["SELF_TEST_TOPIC"].write_queue_nums == 1
    assert topics["BenchmarkTest"].write_queue_nums == 1024
    assert topics["OFFSET_MOVED_EVENT"].write_queue_nums == 1
    assert topics["SCHEDULE_TOPIC_XXXX"].read_queue_nums == 18
    assert topics["C1"].perm == PERM_INHERIT | PERM_READ | PERM_WRITE
    assert topics["b1"].perm == PERM_INHERIT | PERM_READ | PERM_WRITE
    assert topics["b1"].write_queue_nums == 1
    assert topics["C1_REPLY_TOPIC"].write_queue_nums == 1
    assert "RMQ_SYS_TRACE_TOPIC" not in topics


def test_template_follows_auto_create_switch_and_default_queue_nums(config_dir):
    topics = manager(config_dir, default_topic_queue_nums=3).all()
    assert topics["TBW102"].read_queue_nums == 3
    topics = manager(config_dir / "other", auto_create_topic_enable=False).all()
    assert "TBW102" not in topics


def test_turning_auto_create_off_removes_a_persisted_template(config_dir):
    manager(config_dir)
    assert "TBW102" not in manager(config_dir, auto_create_topic_enable=False).all()


def test_trace_topic_exists_when_enabled(config_dir):
    topics = manager(config_dir, trace_topic_enable=True).all()
    assert topics["RMQ_SYS_TRACE_TOPIC"].write_queue_nums == 1


def test_topics_json_has_rocketmq_shape_and_survives_a_restart(config_dir):
    first = manager(config_dir)
    first.update(TopicConfig("Orders", 4, 2, perm=PERM_READ, topic_filter_type="MULTI_TAG"))
    document = json.loads((config_dir / "topics.json").read_text())
    assert document["topicConfigTable"]["Orders"] == {
        "order": False,
        "perm": 4,
        "readQueueNums": 4,
        "topicFilterType": "MULTI_TAG",
        "topicName": "Orders",
        "topicSysFlag": 0,
        "writeQueueNums": 2,
    }
    assert document["dataVersion"]["counter"] == first.data_version.counter
    second = manager(config_dir)
    assert second.get("Orders") == first.get("Orders")
    assert second.data_version.counter == first.data_version.counter


def test_persisted_built_in_topic_config_wins_over_the_default(config_dir):
    first = manager(config_dir)
    first.update(TopicConfig("TBW102", 16, 16, perm=7))
    assert manager(config_dir).get("TBW102").write_queue_nums == 16


def test_send_creates_topic_from_template_with_min_queue_nums(config_dir):
    changes = []
    topics = manager(config_dir, changes)
    created = topics.create_topic_in_send_process("NewTopic", "TBW102", 4, 0)
    assert created == TopicConfig("NewTopic", 4, 4, perm=PERM_READ | PERM_WRITE)
    assert topics.get("NewTopic") == created
    assert changes == [1]
    # an existing topic is returned unchanged, nothing reported
    assert topics.create_topic_in_send_process("NewTopic", "TBW102", 2, 0) == created
    assert changes == [1]
    # more queues than the template has: the template's count
    assert topics.create_topic_in_send_process("Wide", "TBW102", 64, 0).write_queue_nums == 8
    assert "NewTopic" in json.loads((config_dir / "topics.json").read_text())["topicConfigTable"]


def test_template_must_exist_and_be_inheritable(config_dir):
    topics = manager(config_dir)
    assert topics.create_topic_in_send_process("T1", "NoSuchTemplate", 4, 0) is None
    topics.update(TopicConfig("Plain", 4, 4, perm=PERM_READ | PERM_WRITE))
    assert topics.create_topic_in_send_process("T1", "Plain", 4, 0) is None
    topics.update(TopicConfig("Template2", 2, 2, perm=7, topic_filter_type="MULTI_TAG"))
    created = topics.create_topic_in_send_process("T1", "Template2", 4, 0)
    assert created.write_queue_nums == 2
    assert created.topic_filter_type == "MULTI_TAG"
    assert topics.get("T1") is not None


def test_no_creation_from_tbw102_while_auto_create_is_off(config_dir):
    topics = manager(config_dir, auto_create_topic_enable=False)
    topics.update(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, 8, 8, perm=7))  # e.g. by an admin
    assert topics.create_topic_in_send_process("T1", "TBW102", 4, 0) is None
    assert topics.get("T1") is None


def test_send_back_topics_are_created_once(config_dir):
    changes = []
    topics = manager(config_dir, changes)
    retry = topics.create_topic_for_send_back("%RETRY%g1", 1, PERM_READ | PERM_WRITE)
    assert retry == TopicConfig("%RETRY%g1", 1, 1, perm=6)
    assert topics.create_topic_for_send_back("%RETRY%g1", 3, 2) == retry
    assert changes == [1]


def test_update_and_delete_bump_the_version_and_report(config_dir):
    changes = []
    topics = manager(config_dir, changes)
    version = topics.data_version.counter
    topics.update(TopicConfig("A", 4, 4))
    topics.update(TopicConfig("A", 4, 4))  # no change: no bump, no report
    assert topics.data_version.counter == version + 1
    assert topics.delete("A") is True
    assert topics.delete("A") is False
    assert topics.data_version.counter == version + 2
    assert changes == [1, 1]
    assert topics.get("A") is None
    assert manager(config_dir).get("A") is None


def test_system_topics(config_dir):
    topics = manager(config_dir, broker_cluster_name="C1", broker_name="b1")
    for topic in (
        "TBW102",
        "SCHEDULE_TOPIC_XXXX",
        "C1",
        "b1",
        "rmq_sys_anything",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "BenchmarkTest",
    ):
        assert topics.is_system_topic(topic), topic
    for topic in ("Orders", "%RETRY%g1", "%DLQ%g1"):
        assert not topics.is_system_topic(topic), topic
    assert is_not_allowed_send_topic("SCHEDULE_TOPIC_XXXX")
    assert is_not_allowed_send_topic("OFFSET_MOVED_EVENT")
    assert not is_not_allowed_send_topic("TBW102")
    assert not is_not_allowed_send_topic("BenchmarkTest")


def test_changes_name_the_topics_created_or_changed_and_removals_name_none(config_dir):
    told = []
    topics = TopicConfigManager(BrokerConfig(), config_dir, on_change=told.append)
    topics.update(TopicConfig("Orders", 4, 4))
    topics.create_topic_for_send_back("%RETRY%g", 1, 6)
    topics.delete("Orders")
    assert told == [("Orders",), ("%RETRY%g",), None]


def test_deferred_persistence_writes_through_snapshots(config_dir):
    topics = manager(config_dir)
    scheduled = []
    topics.defer_persistence(lambda: scheduled.append(1))
    topics.update(TopicConfig("Orders", 4, 4))
    path = config_dir / "topics.json"
    assert "Orders" not in path.read_text()  # not written on the caller's thread
    assert scheduled == [1]
    snapshot = topics.snapshot_if_dirty()
    assert snapshot is not None
    topics.update(TopicConfig("Refunds", 2, 2))
    newer = topics.snapshot_if_dirty()
    topics.write_snapshot(newer)
    topics.write_snapshot(snapshot)  # an older snapshot finishing late is skipped
    assert topics.snapshot_if_dirty() is None
    saved = path.read_text()
    assert "Orders" in saved and "Refunds" in saved
    assert set(manager(config_dir).all()) >= {"Orders", "Refunds"}
