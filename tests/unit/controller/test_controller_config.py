"""Controller-mode keys of BrokerConfig: bad combinations fail at start, naming the key."""

from __future__ import annotations

import pytest

from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.errors import ConfigError


def _config(**keys: object) -> BrokerConfig:
    base: dict[str, object] = {"enable_controller_mode": True,
                               "controller_addr": "127.0.0.1:2379", "broker_id": 1,
                               "broker_role": BrokerRole.SYNC_MASTER}
    return BrokerConfig(**{**base, **keys})


def test_a_good_controller_mode_config_is_taken() -> None:
    config = _config(controller_addr="127.0.0.1:2379;127.0.0.1:22379", broker_id=3)
    assert config.enable_controller_mode and config.broker_id == 3


@pytest.mark.parametrize(("keys", "words"), [
    ({"controller_addr": None}, "needs controllerAddr"),
    ({"controller_addr": "127.0.0.1"}, "controllerAddr='127.0.0.1'"),
    ({"controller_addr": "127.0.0.1:99999"}, "is not host:port"),
    ({"broker_role": BrokerRole.SLAVE}, "brokerRole=SLAVE with enableControllerMode"),
    ({"broker_id": 0}, "brokerId=0 with enableControllerMode"),
    ({"controller_heart_beat_timeout_ms": 2500}, "multiple of 1000"),
    ({"controller_heart_beat_timeout_ms": 2000, "broker_heartbeat_interval_ms": 1500},
     "must be below"),
    ({"controller_etcd_prefix": "tidemq"}, "starting with '/'"),
])
def test_bad_controller_mode_settings_are_refused(keys: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=None) as refused:
        _config(**keys)
    assert words in str(refused.value)


def test_without_controller_mode_the_static_rules_stay() -> None:
    with pytest.raises(ConfigError, match="a master has brokerId 0"):
        BrokerConfig(broker_id=1, broker_role=BrokerRole.SYNC_MASTER)
