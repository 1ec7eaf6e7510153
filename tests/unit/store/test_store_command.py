"""``tidemq store check`` and ``tidemq store dump`` on real store directories."""

from __future__ import annotations

import os
import random
import struct

from click.testing import CliRunner
from store_helpers import message

from tidemq.cli.main import main
from tidemq.store.file_store import FileMessageStore

TOPIC = "Orders"


def write_store(config, count=60):
    store = FileMessageStore(config)
    results = [
        store.put_message(message(queue_id=i % 2, body=f"payload-{i}".encode() * 40,
                                  tags="paid", keys=f"order-{i}"))
        for i in range(count)
    ]
    store.close()
    return results


def run(*args):
    return CliRunner().invoke(main, ["store", *args])


def test_check_passes_a_clean_store_with_a_summary(config):
    write_store(config)
    result = run("check", config.store_path_root_dir)
    assert result.exit_code == 0, result.output
    assert "60 records" in result.output
    assert "2 consume queues, 60 entries" in result.output
    assert "no problems" in result.output


def test_check_reports_a_flipped_body_bit_with_file_and_offset(config):
    results = write_store(config)
    seed = 20240601
    print(f"seed={seed}")
    rng = random.Random(seed)
    victim = results[rng.randrange(len(results))]
    segment = os.path.join(config.store_path_root_dir, "commitlog", "0" * 20)
    at = victim.physical_offset + 88 + rng.randrange(100)  # inside the body
    with open(segment, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    result = run("check", config.store_path_root_dir)
    assert result.exit_code == 1
    assert f"{segment}:{victim.physical_offset}: body CRC" in result.output
    assert "1 problems" in result.output


def test_check_reports_a_consume_queue_entry_that_points_nowhere(config):
    write_store(config)
    queue_file = os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "1", "0" * 20)
    with open(queue_file, "r+b") as f:
        f.seek(3 * 20 + 8)
        f.write(struct.pack(">i", 77))  # entry 3 claims the wrong size
        f.seek(5 * 20)
        f.write(struct.pack(">q", 13))  # entry 5 points into the middle of a record
    result = run("check", config.store_path_root_dir)
    assert result.exit_code == 1
    assert f"{queue_file}:60: entry 3 of {TOPIC}/1" in result.output
    assert "the entry says 77" in result.output
    assert f"{queue_file}:100: entry 5 of {TOPIC}/1 -> physical offset 13" in result.output


def test_check_reports_garbage_after_the_last_record(config):
    results = write_store(config, count=5)
    end = results[-1].physical_offset + results[-1].wrote_bytes
    segment = os.path.join(config.store_path_root_dir, "commitlog", "0" * 20)
    with open(segment, "r+b") as f:
        f.seek(end + 10)
        f.write(b"\xff" * 5)
    result = run("check", config.store_path_root_dir)
    assert result.exit_code == 1
    assert f"{segment}:{end}: 15 bytes of data after the last valid record" in result.output


def test_dump_prints_records_from_the_log_and_through_a_queue(config):
    results = write_store(config, count=6)
    log = run("dump", config.store_path_root_dir, "--count", "2")
    assert log.exit_code == 0, log.output
    assert log.output.count("physical_offset=") == 2
    assert f"physical_offset=0 size={results[0].wrote_bytes} topic={TOPIC} queue_id=0" in log.output
    assert "KEYS=order-0" in log.output
    assert "body (360 bytes): b'payload-0payload-0" in log.output

    queue = run("dump", config.store_path_root_dir, "--topic", TOPIC, "--queue", "1",
                "--offset", "1", "--count", "5")
    assert queue.exit_code == 0, queue.output
    assert queue.output.count("physical_offset=") == 2  # queue 1 has offsets 0..2
    assert f"physical_offset={results[3].physical_offset}" in queue.output
    assert "queue_offset=1" in queue.output and "queue_offset=2" in queue.output
    missing = run("dump", config.store_path_root_dir, "--topic", "Nope")
    assert "no consume queue Nope/0" in missing.output


def test_check_says_when_a_directory_is_not_a_store(tmp_path):
    result = run("check", str(tmp_path))
    assert result.exit_code == 1
    assert "no commitlog directory" in result.output
