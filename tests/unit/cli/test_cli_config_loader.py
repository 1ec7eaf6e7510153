"""Config loading: RocketMQ .properties files and --<key> value overrides into dataclasses."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tidemq.config_loader import (
    load_config,
    parse_override_args,
    parse_properties,
)
from tidemq.errors import ConfigError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.store.config import FlushDiskType, StoreConfig


class Role(enum.StrEnum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SLAVE = "SLAVE"


@dataclass
class ServerSettings:
    broker_name: str = field(default="broker-a", metadata={"key": "brokerName"})
    listen_port: int = field(default=10911, metadata={"key": "listenPort", "min": 0,
                                                      "max": 65535})
    auto_create_topic_enable: bool = field(default=True,
                                           metadata={"key": "autoCreateTopicEnable"})
    broker_role: Role = field(default=Role.ASYNC_MASTER, metadata={"key": "brokerRole"})
    namesrv_addr: str | None = field(default=None, metadata={"key": "namesrvAddr"})
    mode: str = field(default="a", metadata={"key": "mode", "choices": ("a", "b")})
    ratio: float = 0.5
    derived: int = field(default=0, metadata={"config": False})


@dataclass
class DiskSettings:
    store_path_root_dir: str = "./data"
    flush_interval_commit_log_ms: int = 500
    file_reserved_time_hours: int = 72
    check_crc_on_recover: bool = True
    message_delay_level: str = "1s"


@dataclass
class SharedSettings:
    message_delay_level: str = field(default="1s", metadata={"key": "messageDelayLevel"})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.conf"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_file_or_overrides():
    server, disk = load_config([ServerSettings, DiskSettings], None, {})
    assert server == ServerSettings()
    assert disk == DiskSettings()


def test_file_values_land_in_the_right_dataclass(tmp_path):
    path = write(tmp_path, """\
# a RocketMQ broker.conf
! also a comment
brokerName = broker-b
listenPort=10921
autoCreateTopicEnable = FALSE
brokerRole=SLAVE
storePathRootDir=/data/store
flushIntervalCommitLog=250
fileReservedTime=48
checkCRCOnRecover=false
ratio=0.75
""")
    server, disk = load_config([ServerSettings, DiskSettings], path, {})
    assert (server.broker_name, server.listen_port, server.auto_create_topic_enable,
            server.broker_role, server.ratio) == ("broker-b", 10921, False, Role.SLAVE, 0.75)
    assert (disk.store_path_root_dir, disk.flush_interval_commit_log_ms,
            disk.file_reserved_time_hours, disk.check_crc_on_recover) == (
        "/data/store", 250, 48, False)


def test_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "brokerName=from-file\nlistenPort=1\n")
    (server,) = load_config([ServerSettings], path, {"listenPort": "2"})
    assert server.broker_name == "from-file"
    assert server.listen_port == 2


def test_a_key_declared_by_two_targets_goes_to_both():
    disk, shared = load_config([DiskSettings, SharedSettings], None,
                               {"messageDelayLevel": "1s 5s"})
    assert disk.message_delay_level == shared.message_delay_level == "1s 5s"


def test_empty_value_of_an_optional_field_is_none():
    (server,) = load_config([ServerSettings], None, {"namesrvAddr": ""})
    assert server.namesrv_addr is None


def test_unknown_key_suggests_the_closest_one(tmp_path):
    path = write(tmp_path, "brokerNmae=broker-a\n")
    with pytest.raises(ConfigError) as error:
        load_config([ServerSettings], path, {})
    assert str(error.value) == (
        f"unknown key brokerNmae in {path}; did you mean brokerName?")


def test_unknown_key_on_the_command_line():
    with pytest.raises(ConfigError) as error:
        load_config([ServerSettings], None, {"bogusKey": "1"})
    assert str(error.value).startswith("unknown key bogusKey on the command line; known keys: ")
    assert "listenPort" in str(error.value)


def test_fields_marked_not_configurable_are_unknown_keys():
    with pytest.raises(ConfigError, match="unknown key derived"):
        load_config([ServerSettings], None, {"derived": "1"})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("brokerRole", "MASTER", "brokerRole=MASTER (from the command line): expected one of "
                                 "ASYNC_MASTER, SLAVE"),
        ("listenPort", "abc", "listenPort=abc (from the command line): expected a whole number"),
        ("listenPort", "70000", "expected at most 65535"),
        ("autoCreateTopicEnable", "yes", "expected true or false"),
        ("mode", "c", "expected one of a, b"),
        ("ratio", "half", "expected a number"),
    ],
)
def test_bad_values_name_key_value_and_what_is_allowed(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config([ServerSettings], None, {key: value})


def test_store_config_keys_and_enum_values():
    (store,) = load_config([StoreConfig], None, {
        "flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": "65536",
        "deleteWhen": "04;16", "diskMaxUsedSpaceRatio": "80", "fileReservedTime": "48",
        "storePathRootDir": "/tmp/x", "checkCRCOnRecover": "false"})
    assert store.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert (store.mapped_file_size_commit_log, store.delete_when, store.disk_max_used_space_ratio,
            store.file_reserved_time_hours, store.store_path_root_dir,
            store.check_crc_on_recover) == (65536, "04;16", 80, 48, "/tmp/x", False)


def test_store_flush_disk_type_error_lists_the_choices():
    with pytest.raises(ConfigError,
                       match=r"flushDiskType=SYNC .*expected one of ASYNC_FLUSH, SYNC_FLUSH"):
        load_config([StoreConfig], None, {"flushDiskType": "SYNC"})


def test_namesrv_config_keys():
    (config,) = load_config([NamesrvConfig], None, {
        "listenPort": "9877", "orderMessageEnable": "true", "listenAddress": "0.0.0.0",
        "brokerChannelExpiredTime": "30000"})
    assert (config.listen_port, config.order_message_enable, config.bind_address,
            config.broker_channel_expired_time_ms) == (9877, True, "0.0.0.0", 30000)


def test_rocketmq_keys_tidemq_ignores_are_accepted_with_a_notice(tmp_path, caplog):
    path = write(tmp_path, "rocketmqHome=/opt/rocketmq\nserverWorkerThreads=8\nlistenPort=9\n")
    with caplog.at_level(logging.INFO, logger="tidemq.config_loader"):
        (config,) = load_config([NamesrvConfig], path, {})
    assert config.listen_port == 9
    assert "ignoring rocketmqHome=/opt/rocketmq" in caplog.text
    assert "serverWorkerThreads" in caplog.text


def test_unreadable_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.conf"
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.conf"):
        load_config([NamesrvConfig], missing, {})


def test_properties_syntax_follows_java():
    text = (
        "a=1\n"
        "  b : 2  \n"
        "c 3\n"
        "d\\:e=x\\=y\n"
        "f=line one \\\n"
        "    continued\n"
        "g=\\u0041\\tB\n"
        "h=ends with backslash \\\\\n"
        "i=\n"
        "# j=commented\n"
        "\n"
        "k==v\n"
        "a=last wins\r\n"
        "l=trailing escaped space\\ \n"
    )
    assert parse_properties(text) == {
        "a": "last wins", "b": "2", "c": "3", "d:e": "x=y", "f": "line one continued",
        "g": "A\tB", "h": "ends with backslash \\", "i": "", "k": "=v",
        "l": "trailing escaped space ",
    }


def test_override_args():
    assert parse_override_args(["--listenPort", "10911", "--brokerName=b", "--x", "-1"]) == {
        "listenPort": "10911", "brokerName": "b", "x": "-1"}
    with pytest.raises(ConfigError, match="--listenPort needs a value"):
        parse_override_args(["--listenPort"])
    with pytest.raises(ConfigError, match="--a needs a value"):
        parse_override_args(["--a", "--b", "1"])
    with pytest.raises(ConfigError, match="unexpected argument 'stray'"):
        parse_override_args(["stray"])
