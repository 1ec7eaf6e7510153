"""Fixtures for the store tests: small segments so rolls happen after a few records."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from store_helpers import small_config

from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import MessageStore
from tidemq.store.memory_store import MemoryMessageStore


@pytest.fixture
def config(tmp_path) -> StoreConfig:
    return small_config(tmp_path / "store")


@pytest.fixture(params=["file", "memory"])
def store(request, config) -> Iterator[MessageStore]:
    """The same behavioural tests run against the file store and its memory twin."""
    opened: MessageStore = (
        FileMessageStore(config) if request.param == "file" else MemoryMessageStore(config)
    )
    yield opened
    opened.close()
