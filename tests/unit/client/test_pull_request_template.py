"""A consumer's parked pulls rendered from a template are the pulls pull_request_fields makes."""

import pytest

from tidemq.client import broker_api
from tidemq.client.message import MessageQueue
from tidemq.client.subscription import parse_subscription, parse_tag_expression
from tidemq.protocol.command import RemotingCommand, TemplateRequest

QUEUE = MessageQueue("Orders", "broker-a", 3)


@pytest.mark.parametrize("lite", [True, False])
@pytest.mark.parametrize("suspend_ms", [0, 15_000])
@pytest.mark.parametrize("commit", [None, 0, -1, 1, 123_456_789_012])
@pytest.mark.parametrize("expression", ["*", "paid || refunded"])
def test_a_rendered_pull_is_byte_for_byte_the_pull_of_its_fields(lite, suspend_ms, commit,
                                                                  expression):
    subscription = parse_tag_expression("Orders", expression)
    template = broker_api.pull_request_template(
        "cg", QUEUE, 32, subscription, suspend_timeout_ms=suspend_ms, lite=lite)
    assert template is not None
    for offset in (0, 7, 2**40):
        rendered = template.render(offset, commit)
        assert isinstance(rendered, TemplateRequest)
        fields = broker_api.pull_request_fields(
            "cg", QUEUE, offset, 32, subscription, suspend_timeout_ms=suspend_ms,
            commit_offset=commit, lite=lite)
        expected = RemotingCommand(broker_api.PULL_MESSAGE_CODE, rendered.opaque, 0, None,
                                   fields)
        assert rendered.encode_parts() == expected.encode_parts()


def test_a_subscription_that_needs_json_escaping_has_no_template():
    # The consumers then build each pull from pull_request_fields, as before.
    subscription = parse_subscription("Orders", 'name = \'a"b\'', "SQL92")
    assert broker_api.pull_request_template("cg", QUEUE, 32, subscription) is None
