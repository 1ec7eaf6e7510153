"""Offset JSON, rate limits spread by backlog, and how ranges become partitions."""

from __future__ import annotations

import itertools
import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_tidemq.offsets import (
    QueueRange,
    limit_by_backlog,
    offsets_from_json,
    offsets_to_json,
    ranges_between,
    split_ranges,
)
from tidemq.client.message import MessageQueue

pytestmark = pytest.mark.spark


def q(broker: str, queue_id: int, topic: str = "Orders") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def test_offsets_json_is_grouped_by_topic_and_keyed_broker_colon_queue():
    offsets = {q("broker-b", 0): 5, q("broker-a", 1): 7, q("broker-a", 0, "Logs"): 0}

    text = json.dumps(offsets_to_json(offsets))

    assert json.loads(text) == {"Logs": {"broker-a:0": 0},
                                "Orders": {"broker-a:1": 7, "broker-b:0": 5}}
    assert offsets_from_json(json.loads(text)) == offsets


@pytest.mark.parametrize("bad", [
    [], {"Orders": 5}, {"Orders": {"broker-a": 1}}, {"Orders": {"broker-a:x": 1}},
    {"Orders": {"broker-a:0": "7"}}, {"Orders": {"broker-a:0": True}},
])
def test_malformed_offsets_json_is_rejected_with_the_reason(bad):
    with pytest.raises(ValueError, match="offsets"):
        offsets_from_json(bad, what="test offsets")


def test_limit_spreads_offsets_in_proportion_to_backlog_and_reads_exactly_the_limit():
    start = {q("a", 0): 0, q("a", 1): 100, q("b", 0): 50}
    latest = {q("a", 0): 600, q("a", 1): 400, q("b", 0): 150}  # backlogs 600, 300, 100

    end = limit_by_backlog(start, latest, 100)

    assert {k: end[k] - start[k] for k in start} == {q("a", 0): 60, q("a", 1): 30, q("b", 0): 10}


def test_without_a_limit_or_within_it_every_queue_reads_to_latest():
    start = {q("a", 0): 3, q("a", 1): 9}
    latest = {q("a", 0): 10, q("a", 1): 9}

    assert limit_by_backlog(start, latest, None) == latest
    assert limit_by_backlog(start, latest, 7) == latest


def test_queues_without_backlog_keep_their_start():
    start = {q("a", 0): 5, q("gone", 0): 8}

    assert limit_by_backlog(start, {q("a", 0): 5}, 10) == start


_queues = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
                   min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_queues, st.integers(1, 5_000))
def test_a_limited_batch_never_reads_more_than_the_limit_and_never_goes_back(pairs, limit):
    start = {q("a", i): min(s, e) for i, (s, e) in enumerate(pairs)}
    latest = {q("a", i): max(s, e) for i, (s, e) in enumerate(pairs)}

    end = limit_by_backlog(start, latest, limit)

    read = sum(end[k] - start[k] for k in start)
    assert read == min(limit, sum(latest[k] - start[k] for k in start))
    assert all(start[k] <= end[k] <= latest[k] for k in start)


def test_ranges_start_new_queues_at_their_earliest_offset():
    start = {q("a", 0): 10}
    end = {q("a", 0): 20, q("a", 1): 30, q("a", 2): 0}

    ranges = ranges_between(start, end, earliest={q("a", 1): 25})

    assert ranges == [QueueRange("Orders", "a", 0, 10, 20, False),
                      QueueRange("Orders", "a", 1, 25, 30, True)]


def test_a_queue_that_started_again_is_read_from_its_earliest_offset():
    # end before start: the topic was deleted and re-created (failOnDataLoss=false)
    ranges = ranges_between({q("a", 0): 50}, {q("a", 0): 7}, earliest={q("a", 0): 2})

    assert ranges == [QueueRange("Orders", "a", 0, 2, 7, True)]


def test_max_records_per_partition_cuts_ranges_into_near_equal_pieces():
    ranges = [QueueRange("Orders", "a", 0, 0, 10), QueueRange("Orders", "a", 1, 5, 8)]

    pieces = split_ranges(ranges, max_records_per_partition=4)

    assert [(p.queue_id, p.start_offset, p.end_offset) for p in pieces] == [
        (0, 0, 4), (0, 4, 7), (0, 7, 10), (1, 5, 8)]


def test_min_partitions_cuts_the_big_ranges_first():
    ranges = [QueueRange("Orders", "a", 0, 0, 900), QueueRange("Orders", "a", 1, 0, 100)]

    pieces = split_ranges(ranges, min_partitions=10)

    assert len(pieces) >= 10
    assert sum(1 for p in pieces if p.queue_id == 0) == 9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5_000), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(1, 40)), st.one_of(st.none(), st.integers(1, 3_000)))
def test_split_ranges_cover_every_offset_once(sizes, min_partitions, max_records):
    ranges = [QueueRange("Orders", "a", i, 100, 100 + size) for i, size in enumerate(sizes)]

    pieces = split_ranges(ranges, min_partitions=min_partitions,
                          max_records_per_partition=max_records)

    for original in ranges:
        mine = [p for p in pieces if p.queue_id == original.queue_id]
        assert mine[0].start_offset == original.start_offset
        assert mine[-1].end_offset == original.end_offset
        assert all(a.end_offset == b.start_offset for a, b in itertools.pairwise(mine))
        assert all(p.size >= 1 for p in mine)
        if max_records is not None:
            assert all(p.size <= max_records for p in mine)
    if min_partitions is not None:
        assert len(pieces) >= min(min_partitions, sum(sizes))


def test_ranges_pickle_as_small_descriptors():
    queue_range = QueueRange("Orders", "broker-a", 2, 10, 20)

    assert pickle.loads(pickle.dumps(queue_range)) == queue_range
    assert len(pickle.dumps(queue_range)) < 300
