"""tidemq.store: the message store (commit log, consume queues, index), sync and network-free.

Start at ``interface.py`` (what the broker uses) and ``store_core.py`` (how an append and a
read work); ``file_store.py`` adds the files, recovery and flushing.
"""

from tidemq.store.config import FlushDiskType, StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import (
    GetResult,
    GetStatus,
    MessageStore,
    PutResult,
    PutStatus,
    QueryResult,
    StoreMessage,
)
from tidemq.store.memory_store import MemoryMessageStore

__all__ = [
    "FileMessageStore",
    "FlushDiskType",
    "GetResult",
    "GetStatus",
    "MemoryMessageStore",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "QueryResult",
    "StoreConfig",
    "StoreMessage",
]
