"""Tag expressions, client-side tag matching, and group queue allocation."""

from __future__ import annotations

import pytest

from tidemq.client.errors import InvalidSubscription
from tidemq.client.message import MessageQueue
from tidemq.client.rebalance import allocate_averagely
from tidemq.client.subscription import parse_tag_expression
from tidemq.protocol.message import MessageExt


def tagged(tag: str | None) -> MessageExt:
    return MessageExt(topic="T", body=b"", properties={"TAGS": tag} if tag else {})


@pytest.mark.parametrize("expression", [None, "", "*", "  *  "])
def test_star_or_empty_subscribes_everything(expression):
    subscription = parse_tag_expression("T", expression)
    assert subscription.matches_all
    assert subscription.matches(tagged(None)) and subscription.matches(tagged("x"))
    assert subscription.to_json()["tagsSet"] == []


def test_tags_are_split_on_double_bar_and_trimmed():
    subscription = parse_tag_expression("T", " TagA || TagB ||")
    assert subscription.tags == {"TagA", "TagB"}
    assert subscription.matches(tagged("TagA"))
    assert not subscription.matches(tagged("TagC"))
    assert not subscription.matches(tagged(None))
    data = subscription.to_json()
    assert data["tagsSet"] == ["TagA", "TagB"]
    assert data["codeSet"] == [2598919, 2598920]  # Java "TagA".hashCode(), "TagB".hashCode()
    assert data["expressionType"] == "TAG" and data["topic"] == "T"


def test_expression_without_a_tag_is_refused():
    with pytest.raises(InvalidSubscription):
        parse_tag_expression("T", "||")


def queues(n: int) -> list[MessageQueue]:
    return [MessageQueue("T", "b", i) for i in range(n)]


def test_eight_queues_three_members_get_three_three_two():
    members = ["c1", "c2", "c3"]
    shares = [[q.queue_id for q in allocate_averagely(queues(8), members, m)] for m in members]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_allocation_ignores_input_order_and_covers_each_queue_once():
    members = ["z", "a", "m", "q"]
    all_queues = queues(10)
    shares = [allocate_averagely(list(reversed(all_queues)), members, m) for m in members]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == all_queues and len(flat) == len(set(flat))


def test_more_members_than_queues_leaves_the_last_members_idle():
    members = ["a", "b", "c"]
    assert [len(allocate_averagely(queues(2), members, m)) for m in members] == [1, 1, 0]


def test_unknown_member_or_no_queues_gets_nothing():
    assert allocate_averagely(queues(4), ["a"], "b") == []
    assert allocate_averagely([], ["a"], "a") == []
