"""Subscribing with SQL92: checked at subscribe, reported in heartbeats as SQL92 with no tags,
and never re-filtered by tags on the client; TAG subscriptions unchanged."""

from __future__ import annotations

import pytest

from tidemq.client import PullConsumer, PushConsumer
from tidemq.client.errors import InvalidSubscription
from tidemq.client.subscription import parse_subscription
from tidemq.protocol.message import MessageExt


def test_sql92_subscription_reports_its_type_and_no_tags():
    subscription = parse_subscription("T", " a > 5 ", "sql92")
    data = subscription.to_json()
    assert data["expressionType"] == "SQL92" and data["subString"] == "a > 5"
    assert data["tagsSet"] == [] and data["codeSet"] == []
    # the broker alone filters SQL92: any message the broker sends is kept
    assert subscription.matches(MessageExt("T", b"x", properties={"TAGS": "Other"}))


def test_tag_subscription_is_unchanged():
    data = parse_subscription("T", "TagA || TagB").to_json()
    assert data["expressionType"] == "TAG" and data["tagsSet"] == ["TagA", "TagB"]


def test_bad_sql92_fails_at_subscribe_with_its_position():
    consumer = PushConsumer("cg_sql_unit", "127.0.0.1:9")
    with pytest.raises(InvalidSubscription, match="position 4"):
        consumer.subscribe("T", "a > 'x'", expression_type="SQL92")
    with pytest.raises(InvalidSubscription, match="TAG"):
        consumer.subscribe("T", "a", expression_type="XPATH")
    with pytest.raises(InvalidSubscription, match="empty"):
        PullConsumer("cg_sql_unit").subscribe("T", "  ", expression_type="SQL92")


def test_push_consumer_heartbeat_carries_the_sql92_subscription():
    consumer = PushConsumer("cg_sql_unit", "127.0.0.1:9")
    consumer.subscribe("T", "region = 'eu'", expression_type="SQL92")
    by_topic = {s["topic"]: s for s in consumer.subscription_data()}
    assert by_topic["T"]["expressionType"] == "SQL92"
    assert by_topic["%RETRY%cg_sql_unit"]["expressionType"] == "TAG"
