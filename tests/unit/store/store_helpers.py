"""Helpers shared by the store tests (imported as a plain module: no package here)."""

from __future__ import annotations

from tidemq.store.config import StoreConfig
from tidemq.store.interface import StoreMessage

SEGMENT_SIZE = 64 * 1024
QUEUE_SEGMENT_SIZE = 20 * 100  # 100 entries per consume-queue segment


def small_config(root: object, **overrides: object) -> StoreConfig:
    """A store config with 64 KiB commit-log segments and 100-entry queue segments."""
    settings: dict[str, object] = {
        "store_path_root_dir": str(root),
        "mapped_file_size_commit_log": SEGMENT_SIZE,
        "mapped_file_size_consume_queue": QUEUE_SEGMENT_SIZE,
        "max_hash_slot_num": 64,
        "max_index_num": 1000,
    }
    settings.update(overrides)
    return StoreConfig(**settings)  # type: ignore[arg-type]


def message(
    topic: str = "Orders",
    queue_id: int = 0,
    body: bytes = b"hello",
    *,
    tags: str | None = None,
    keys: str | None = None,
    unique_key: str | None = None,
    **fields: object,
) -> StoreMessage:
    """A StoreMessage with TAGS / KEYS / UNIQ_KEY properties when given."""
    properties: dict[str, str] = {}
    if tags is not None:
        properties["TAGS"] = tags
    if keys is not None:
        properties["KEYS"] = keys
    if unique_key is not None:
        properties["UNIQ_KEY"] = unique_key
    return StoreMessage(topic, queue_id, body, properties, **fields)  # type: ignore[arg-type]
