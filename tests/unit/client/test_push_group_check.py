"""The warning for members of one group that subscribe differently."""

from __future__ import annotations

from tidemq.client.push_rebalance import subscription_difference

MEMBERS = ["10.0.0.1@a", "10.0.0.2@b", "10.0.0.3@c"]


def test_same_subscriptions_give_no_warning_whatever_the_tag_order_and_spacing():
    own = {"Orders": "paid || refunded", "%RETRY%g": "*"}
    registered = {"Orders": "refunded||paid", "%RETRY%g": "*"}
    assert subscription_difference("g", MEMBERS[0], own, registered, MEMBERS) is None


def test_different_tags_name_the_topic_both_expressions_and_the_members():
    own = {"Orders": "paid", "%RETRY%g": "*"}
    registered = {"Orders": "refunded", "%RETRY%g": "*"}
    text = subscription_difference("g", MEMBERS[0], own, registered, MEMBERS)
    assert text is not None
    assert "consumer group g subscribe differently" in text
    assert "Orders: this member 'paid', another 'refunded'" in text
    assert f"this member {MEMBERS[0]}" in text
    assert "10.0.0.2@b, 10.0.0.3@c" in text  # the other members
    assert "use one group per subscription" in text


def test_different_topics_say_which_side_subscribes_what():
    own = {"Orders": "*", "%RETRY%g": "*"}
    registered = {"Payments": "*", "%RETRY%g": "*"}
    text = subscription_difference("g", MEMBERS[1], own, registered, MEMBERS)
    assert text is not None
    assert "only this member subscribes Orders" in text
    assert "another member subscribes Payments, this one does not" in text


def test_everything_and_a_tag_differ():
    text = subscription_difference("g", MEMBERS[0], {"T": "*"}, {"T": "TagA"}, MEMBERS)
    assert text is not None and "T: this member '*', another 'TagA'" in text
