"""BrokerConfig: RocketMQ's keys and defaults, validation, derived values, properties text."""

from __future__ import annotations

import pytest

from tidemq.broker.config import (
    BrokerConfig,
    BrokerRole,
    config_properties,
    properties_text,
)
from tidemq.broker.transaction.service import TransactionSettings
from tidemq.config_loader import load_config, parse_properties
from tidemq.errors import ConfigError
from tidemq.store.config import FlushDiskType, StoreConfig


def test_defaults_are_rocketmq_defaults_with_documented_exceptions():
    config = BrokerConfig()
    assert config.broker_cluster_name == "DefaultCluster"
    assert config.broker_name == "broker-a"  # RocketMQ: the host name (see the comment)
    assert config.broker_id == 0
    assert config.namesrv_addr is None
    assert config.listen_port == 10911
    assert config.broker_role is BrokerRole.ASYNC_MASTER
    assert config.auto_create_topic_enable is True
    assert config.default_topic_queue_nums == 8
    assert config.broker_permission == 6
    assert config.region_id == "DefaultRegion"
    assert config.trace_on is True
    assert config.register_name_server_period_ms == 30_000
    assert config.long_polling_enable is True
    assert config.short_polling_time_ms == 1000
    assert config.flush_consumer_offset_interval_ms == 5000
    assert config.channel_expired_timeout_ms == 120_000
    assert config.default_query_max_num == 32
    assert config.message_delay_level.split()[0] == "1s"
    assert config.delay_level_count() == 18


def test_broker_properties_file_loads_with_rocketmq_key_names(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName = ClusterB\n"
        "brokerName=broker-b\n"
        "brokerId=0\n"
        "namesrvAddr=127.0.0.1:9876;127.0.0.1:9877\n"
        "listenPort=20911\n"
        "brokerIP1=127.0.0.2\n"
        "brokerRole=SYNC_MASTER\n"
        "autoCreateTopicEnable=false\n"
        "shortPollingTimeMills=700\n"
        "registerNameServerPeriod=15000\n"
        "registerBrokerTimeoutMills=2000\n"
        "channelExpiredTimeout=60000\n"
        "flushDiskType=SYNC_FLUSH\n"
        "messageDelayLevel=1s 2s 3s\n"
        "transactionCheckMax=3\n"
        "exactlyOnceCommitCacheBytes=1048576\n"
    )
    broker_config, store_config = load_config([BrokerConfig, StoreConfig], conf, {})
    assert broker_config.broker_cluster_name == "ClusterB"
    assert broker_config.broker_name == "broker-b"
    assert broker_config.namesrv_addresses == ["127.0.0.1:9876", "127.0.0.1:9877"]
    assert broker_config.broker_address == "127.0.0.2:20911"
    assert broker_config.broker_role is BrokerRole.SYNC_MASTER
    assert broker_config.auto_create_topic_enable is False
    assert broker_config.short_polling_time_ms == 700
    assert broker_config.register_name_server_period_ms == 15_000
    assert broker_config.register_broker_timeout_ms == 2000
    assert broker_config.channel_expired_timeout_ms == 60_000
    assert store_config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    settings = TransactionSettings.from_broker_config(broker_config)
    assert (settings.check_max, settings.commit_cache_bytes) == (3, 1 << 20)
    # messageDelayLevel is declared by both and reaches both
    assert broker_config.delay_level_count() == 3
    assert store_config.delay_level_ms() == (1000, 2000, 3000)


def test_broker_role_outside_choices_fails_naming_the_allowed_values():
    with pytest.raises(ConfigError, match="ASYNC_MASTER, SYNC_MASTER, SLAVE"):
        load_config([BrokerConfig, StoreConfig], None, {"brokerRole": "MASTER"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"broker_name": "bad name"}, "brokerName"),
        ({"broker_cluster_name": ""}, "brokerClusterName"),
        ({"broker_role": "SLAVE"}, "slave needs brokerId > 0"),
        ({"broker_id": 1}, "a master has brokerId 0"),
        ({"namesrv_addr": "localhost"}, "not host:port"),
        ({"message_delay_level": "1s 5x"}, "'5x'"),
        ({"broker_ip1": " "}, "brokerIP1"),
    ],
)
def test_bad_values_fail_at_start_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig(**overrides)


def test_register_period_is_clamped_like_rocketmq():
    assert BrokerConfig(register_name_server_period_ms=1000).register_period_ms == 10_000
    assert BrokerConfig(register_name_server_period_ms=90_000).register_period_ms == 60_000
    assert BrokerConfig(register_name_server_period_ms=20_000).register_period_ms == 20_000


def test_listens_on_the_vip_port_too_unless_any_port_was_asked():
    assert BrokerConfig(listen_port=10911).listen_ports == [10911, 10909]
    assert BrokerConfig(listen_port=0).listen_ports == [0]


def test_ha_address_defaults_to_broker_ip1_and_listen_port_plus_one():
    assert BrokerConfig(listen_port=10911).ha_server_address == "127.0.0.1:10912"
    config = BrokerConfig(broker_ip2="10.0.0.2", ha_listen_port=20000)
    assert config.ha_server_address == "10.0.0.2:20000"


def test_slave_and_read_only_broker_are_not_writable():
    assert BrokerConfig().is_writable
    assert not BrokerConfig(broker_permission=4).is_writable
    assert not BrokerConfig(broker_role="SLAVE", broker_id=1).is_writable


def test_properties_text_round_trips_through_the_loader():
    broker_config = BrokerConfig(broker_name="broker-x", namesrv_addr="127.0.0.1:9876")
    store_config = StoreConfig(store_path_root_dir="/tmp/x", flush_disk_type="SYNC_FLUSH")
    text = properties_text(config_properties(store_config, broker_config))
    properties = parse_properties(text)
    assert properties["brokerName"] == "broker-x"
    assert properties["brokerIP1"] == "127.0.0.1"
    assert properties["flushDiskType"] == "SYNC_FLUSH"
    assert properties["fileReservedTime"] == "72"
    assert properties["brokerIP2"] == ""  # None is written empty
    # what GET_BROKER_CONFIG returns can be fed back as a config file
    properties = {k: v for k, v in properties.items() if v != ""}
    reloaded_broker, reloaded_store = load_config([BrokerConfig, StoreConfig], None, properties)
    assert reloaded_broker == broker_config
    assert reloaded_store.flush_disk_type is FlushDiskType.SYNC_FLUSH
