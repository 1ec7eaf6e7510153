"""MemoryMessageStore: the message store's in-memory twin.

The same code as the file store (store_core.py) over anonymous memory mappings instead of
files: the same validation, the same stored bytes, the same offsets, blank markers and
segment rolls, the same read statuses and retention. It has no files, so nothing survives
``close``, there is no recovery, no flush thread and no lock; ``durable`` is always None.
Use it to test the broker without a disk.

Anonymous mappings cost memory only for the pages written, so a 1 GiB segment size is fine.
"""

from __future__ import annotations

from tidemq.store.commit_log import CommitLog
from tidemq.store.config import StoreConfig
from tidemq.store.consume_queue_table import ConsumeQueueTable
from tidemq.store.memory_index import MemoryIndex
from tidemq.store.store_core import StoreCore


class MemoryMessageStore(StoreCore):
    """A ``MessageStore`` in memory; ``config.store_path_root_dir`` is ignored."""

    def __init__(self, config: StoreConfig | None = None) -> None:
        config = config if config is not None else StoreConfig()
        commit_log = CommitLog(None, config.mapped_file_size_commit_log)
        queues = ConsumeQueueTable(None, config.mapped_file_size_consume_queue)
        index = MemoryIndex() if config.message_index_enable else None
        super().__init__(config, commit_log, queues, index)
