"""Unique keys made for a whole batch (``new_unique_keys``): the same form as one at a time,
distinct from each other, from other runs and from single keys, across threads."""

from __future__ import annotations

import re
import threading
import time

from tidemq.protocol.msgid import new_unique_key, new_unique_keys, unique_key_timestamp

KEY = re.compile(r"[0-9A-F]{32}")


def test_a_run_of_keys_has_the_single_keys_form_and_process_part():
    single = new_unique_key()
    run = new_unique_keys(300)  # more than fit in one 16-bit counter step of hex digits
    assert len(run) == 300
    assert all(KEY.fullmatch(key) for key in run)
    # The first 10 bytes (20 hex characters) are the process's: the same in every key.
    assert {key[:20] for key in run} == {single[:20]}
    assert len(set(run)) == 300


def test_runs_and_single_keys_never_repeat_a_key():
    keys = [new_unique_key()]
    for count in (1, 2, 64, 7):
        keys += new_unique_keys(count)
        keys.append(new_unique_key())
    assert len(set(keys)) == len(keys) == 1 + 74 + 4


def test_a_run_reads_back_the_time_it_was_made():
    before = int(time.time() * 1000)
    (key, *_) = new_unique_keys(3)
    after = int(time.time() * 1000)
    made = unique_key_timestamp(key)
    assert made is not None and before - 1 <= made <= after + 1


def test_no_keys_for_a_count_of_zero_or_less():
    assert new_unique_keys(0) == []
    assert new_unique_keys(-3) == []


def test_runs_from_many_threads_are_distinct():
    made: list[list[str]] = []
    barrier = threading.Barrier(4)

    def make() -> None:
        barrier.wait(timeout=10)
        made.append([key for _ in range(50) for key in new_unique_keys(64)])

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    keys = [key for run in made for key in run]
    # 12,800 keys: below the 65,536 counter values, so none may repeat even within one ms.
    assert len(keys) == 4 * 50 * 64
    assert len(set(keys)) == len(keys)
