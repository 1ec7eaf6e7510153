"""Child process of test_store_crash.py: append under SYNC_FLUSH until killed.

Usage: python store_crash_writer.py STORE_DIR ROUND THREADS

Each thread appends messages with a unique key and, once the message's durable future says
PUT_OK, prints "<physical offset> <unique key>" on its own line (after one line "opened",
once the store is open). A printed offset line is an acknowledgement: the parent kills this
process with SIGKILL at a random moment and then checks that every acknowledged message is
still in the store.
"""

from __future__ import annotations

import sys
import threading

from tidemq.store.config import StoreConfig
from tidemq.store.file_store import FileMessageStore
from tidemq.store.interface import PutStatus, StoreMessage

# Small segments and queue files so a few seconds of writing rolls all of them.
CONFIG_OVERRIDES = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 200,
    "max_hash_slot_num": 64,
    "max_index_num": 2000,
    "flush_disk_type": "SYNC_FLUSH",
    "flush_interval_consume_queue_ms": 50,
}
MESSAGES_PER_THREAD_MAX = 100_000  # a bound; the parent kills us long before
OPENED = "opened"  # the line printed once the store is open (not an acknowledgement)


def main() -> None:
    root, round_number, thread_count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = FileMessageStore(StoreConfig(store_path_root_dir=root, **CONFIG_OVERRIDES))
    print(OPENED, flush=True)  # recovery is done: the parent may time its kill from here
    out_lock = threading.Lock()

    def produce(worker: int) -> None:
        for i in range(MESSAGES_PER_THREAD_MAX):
            key = f"r{round_number}-w{worker}-{i}"
            body = (key * (1 + i % 40)).encode()
            properties = {"UNIQ_KEY": key, "KEYS": f"w{worker}", "TAGS": f"t{i % 3}"}
            if i % 7 == 0:  # some batches too
                keys = [f"{key}.{n}" for n in range(3)]
                result = store.put_messages([
                    StoreMessage("Crash", worker % 3, body, {**properties, "UNIQ_KEY": batch_key})
                    for batch_key in keys
                ])
                offsets = [int(m[-16:], 16) for m in result.msg_ids]
            else:
                result = store.put_message(StoreMessage("Crash", worker % 3, body, properties))
                keys = [key]
                offsets = [result.physical_offset]
            if result.status is not PutStatus.PUT_OK:
                continue
            if result.wait_durable(timeout_s=30) is PutStatus.PUT_OK:
                lines = "".join(f"{o} {k}\n" for o, k in zip(offsets, keys, strict=True))
                with out_lock:
                    sys.stdout.write(lines)
                    sys.stdout.flush()

    threads = [
        threading.Thread(target=produce, args=(w,), daemon=True) for w in range(thread_count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()


if __name__ == "__main__":
    main()
