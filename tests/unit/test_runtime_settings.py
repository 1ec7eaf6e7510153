"""Changing settings of a running server (UPDATE_BROKER_CONFIG / UPDATE_NAMESRV_CONFIG)."""

from __future__ import annotations

import pytest

from tidemq.config_loader import apply_runtime_settings, current_properties
from tidemq.errors import ConfigError
from tidemq.namesrv.config import NamesrvConfig
from tidemq.store.config import StoreConfig


def test_changes_only_runtime_keys_all_or_nothing(tmp_path):
    store = StoreConfig(store_path_root_dir=str(tmp_path))
    applied = apply_runtime_settings([store], "fileReservedTime=100\n", {"fileReservedTime"})
    assert applied == {"fileReservedTime": "100"} and store.file_reserved_time_hours == 100
    with pytest.raises(ConfigError, match="only at start"):
        apply_runtime_settings([store], "fileReservedTime=5\nflushDiskType=SYNC_FLUSH",
                               {"fileReservedTime"})
    assert store.file_reserved_time_hours == 100  # nothing of a refused request applied
    with pytest.raises(ConfigError, match="allowed range"):
        apply_runtime_settings([store], "fileReservedTime=7\ndiskMaxUsedSpaceRatio=200",
                               {"fileReservedTime", "diskMaxUsedSpaceRatio"})
    assert (store.file_reserved_time_hours, store.disk_max_used_space_ratio) == (
        100, StoreConfig(store_path_root_dir=str(tmp_path)).disk_max_used_space_ratio)
    with pytest.raises(ConfigError, match="did you mean fileReservedTime"):
        apply_runtime_settings([store], "fileReservedTim=1", {"fileReservedTime"})
    with pytest.raises(ConfigError, match="no setting"):
        apply_runtime_settings([store], "# nothing\n", {"fileReservedTime"})


def test_current_properties_names_every_primary_key():
    properties = current_properties(NamesrvConfig())
    assert properties["listenPort"] == "9876"
    assert properties["orderMessageEnable"] == "false"
    assert "listenAddress" not in properties  # an alias, not a key of its own
