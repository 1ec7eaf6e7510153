"""The epoch file (store/epochs.py): its format, atomic writes, and the divergence point two
brokers' epoch lists give, checked against simulated group histories (hypothesis)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.store.epochs import (
    EPOCH_FILE_NAME,
    EpochEntry,
    EpochFile,
    EpochFileCorrupt,
    divergence_offset,
    parse,
    render,
)


def test_entries_survive_a_reopen_and_the_file_is_written_atomically(tmp_path):
    epochs = EpochFile(str(tmp_path))
    assert epochs.entries == [] and epochs.last_epoch == 0
    epochs.append(1, 0)
    epochs.append(3, 4096)
    epochs.append(3, 4096)  # repeated: no-op
    assert EpochFile(str(tmp_path)).entries == [EpochEntry(1, 0), EpochEntry(3, 4096)]
    assert sorted(os.listdir(tmp_path)) == [EPOCH_FILE_NAME]  # no temporary file left
    text = (tmp_path / EPOCH_FILE_NAME).read_text()
    assert text.startswith("tidemq-epochs 1\n1 0\n3 4096\ncrc ")


def test_epochs_only_grow(tmp_path):
    epochs = EpochFile(str(tmp_path))
    epochs.append(2, 100)
    with pytest.raises(ValueError, match="strictly increase"):
        epochs.append(2, 200)
    with pytest.raises(ValueError, match="never"):
        epochs.append(3, 50)
    with pytest.raises(ValueError):
        epochs.append(0, 0)


def test_truncate_from_drops_entries_starting_at_or_after_the_cut(tmp_path):
    epochs = EpochFile(str(tmp_path))
    for epoch, start in ((1, 0), (2, 100), (4, 300)):
        epochs.append(epoch, start)
    assert epochs.truncate_from(300) == [EpochEntry(4, 300)]
    assert epochs.truncate_from(301) == []
    assert EpochFile(str(tmp_path)).entries == [EpochEntry(1, 0), EpochEntry(2, 100)]


def test_a_damaged_file_is_refused_naming_it_and_the_fix(tmp_path):
    EpochFile(str(tmp_path)).append(1, 0)
    path = tmp_path / EPOCH_FILE_NAME
    data = bytearray(path.read_bytes())
    data[data.index(b"1 0")] = ord("7")
    path.write_bytes(bytes(data))
    with pytest.raises(EpochFileCorrupt, match=f"{EPOCH_FILE_NAME} fails its CRC.*delete it"):
        EpochFile(str(tmp_path))
    path.write_bytes(b"garbage")
    with pytest.raises(EpochFileCorrupt, match="not a tidemq epoch file"):
        EpochFile(str(tmp_path))
    out_of_order = render([EpochEntry(2, 10), EpochEntry(1, 20)])
    with pytest.raises(EpochFileCorrupt, match="does not follow"):
        parse(out_of_order)


def test_divergence_examples():
    # The old master of epoch 1 wrote up to 1000; its slave had 800 when it became master 2.
    assert divergence_offset([EpochEntry(1, 0)], 1000,
                             [EpochEntry(1, 0), EpochEntry(2, 800)], 1500) == 800
    # A slave behind its master shares everything it has.
    assert divergence_offset([EpochEntry(1, 0)], 500, [EpochEntry(1, 0)], 900) == 500
    # Only epoch 0 (no controller before): the shorter end.
    assert divergence_offset([], 700, [EpochEntry(3, 650)], 900) == 650
    # An epoch the master never had: back to the last shared one.
    assert divergence_offset([EpochEntry(1, 0), EpochEntry(3, 400)], 900,
                             [EpochEntry(1, 0), EpochEntry(2, 300), EpochEntry(4, 600)],
                             1000) == 300


# -- simulated histories ------------------------------------------------------------------------
#
# Brokers hold logs of records (one offset each), every record tagged with the epoch of the
# master that wrote it and a serial number, so the true common prefix of two logs is known.
# Each step either appends at the master, lets a broker catch up from the master (reconciling
# first, as broker/ha/reconcile.py does), or elects any broker as the next master (unclean
# elections included: the epoch logic must still name the true common prefix).


class Broker:
    def __init__(self) -> None:
        self.log: list[tuple[int, int]] = []
        self.epochs: list[EpochEntry] = []

    def truncate(self, offset: int) -> None:
        del self.log[offset:]
        self.epochs = [e for e in self.epochs if e.start_offset < offset]


def common_prefix(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


steps = st.lists(st.tuples(st.sampled_from(["append", "copy", "elect"]),
                           st.integers(0, 3), st.integers(0, 6)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_divergence_is_the_true_common_prefix_in_any_history(history):
    brokers = [Broker() for _ in range(4)]
    master, epoch, serial = 0, 1, 0
    brokers[0].epochs = [EpochEntry(1, 0)]
    for action, who, amount in history:
        leader = brokers[master]
        if action == "append":
            for _ in range(amount):
                serial += 1
                leader.log.append((epoch, serial))
        elif action == "copy" and who != master:
            follower = brokers[who]
            point = divergence_offset(follower.epochs, len(follower.log), leader.epochs,
                                      len(leader.log))
            assert point == common_prefix(follower.log, leader.log), (follower.epochs,
                                                                      leader.epochs)
            follower.truncate(point)
            follower.epochs = list(leader.epochs)
            follower.log.extend(leader.log[point:point + amount])
        elif action == "elect":
            epoch += 1
            master = who
            chosen = brokers[who]
            end = len(chosen.log)
            chosen.epochs = [e for e in chosen.epochs if e.start_offset < end]
            chosen.epochs.append(EpochEntry(epoch, end))
