"""Options are checked on the driver; each error names the option and what is accepted."""

from __future__ import annotations

import pytest

from pyspark_tidemq import InvalidOption
from pyspark_tidemq.options import (
    DEFAULT_READER_GROUP,
    DeliveryGuarantee,
    OffsetKind,
    parse_sink_options,
    parse_source_options,
)
from tidemq.client.message import MessageQueue

pytestmark = pytest.mark.spark

BASE = {"namesrvAddr": "127.0.0.1:9876", "subscribe": "Orders"}


def source(streaming: bool = False, **options: str):
    return parse_source_options({**BASE, **options}, streaming=streaming)


def test_defaults_follow_spark_kafka_connector():
    batch = source()
    stream = source(streaming=True)

    assert batch.starting_offsets.kind is OffsetKind.EARLIEST
    assert batch.ending_offsets.kind is OffsetKind.LATEST
    assert stream.starting_offsets.kind is OffsetKind.LATEST
    assert batch.fail_on_data_loss is True
    assert batch.include_properties is False
    assert batch.reader_group == DEFAULT_READER_GROUP


def test_option_names_are_case_insensitive_as_spark_passes_them():
    options = parse_source_options(
        {"namesrvaddr": "127.0.0.1:9876", "SUBSCRIBE": "A,B, A", "maxoffsetspertrigger": "5"},
        streaming=True,
    )

    assert options.subscribe == ("A", "B")
    assert options.max_offsets_per_trigger == 5


def test_per_queue_offsets_json_is_parsed_with_earliest_and_latest_markers():
    options = source(streaming=True,
                     startingOffsets='{"Orders": {"broker-a:0": 42, "broker-b:3": -2}}')

    assert options.starting_offsets.kind is OffsetKind.PER_QUEUE
    assert options.starting_offsets.queues == {MessageQueue("Orders", "broker-a", 0): 42,
                                               MessageQueue("Orders", "broker-b", 3): -2}


def test_assign_names_exact_queues():
    options = parse_source_options(
        {"namesrvAddr": "h:1", "assign": '{"Orders": ["broker-a:1", "broker-a:0"]}'},
        streaming=False,
    )

    assert options.assign == (MessageQueue("Orders", "broker-a", 0),
                              MessageQueue("Orders", "broker-a", 1))


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"subscribe": "Orders"}, False, "namesrvAddr is required"),
    ({**BASE, "namesrvAddr": "nowhere"}, False, "namesrvAddr='nowhere'"),
    ({"namesrvAddr": "h:1"}, False, "exactly one of the options subscribe"),
    ({**BASE, "subscribePattern": "O.*"}, False, "got subscribe, subscribePattern"),
    ({**BASE, "subscribe": "bad topic!"}, False, "option subscribe: topic name"),
    ({"namesrvAddr": "h:1", "subscribePattern": "("}, False, "not a regular expression"),
    ({"namesrvAddr": "h:1", "assign": '{"Orders": [0]}'}, False, "brokerName:queueId"),
    ({"namesrvAddr": "h:1", "assign": "[1]"}, False, "option assign"),
    ({**BASE, "startingOffsets": "newest"}, False, "expected earliest, or JSON"),
    ({**BASE, "startingOffsets": "latest"}, False, "startingOffsets='latest' is not allowed"),
    ({**BASE, "endingOffsets": "earliest"}, False, "endingOffsets='earliest' is not allowed"),
    ({**BASE, "startingOffsets": '{"Orders": {"broker-a:0": -1}}'}, False,
     "offset -1 of Orders broker-a:0 is not allowed"),
    ({**BASE, "startingOffsets": '{"Orders": {"broker-a:0": -7}}'}, True, "offset -7"),
    ({**BASE, "endingOffsets": "latest"}, True, "endingOffsets is for batch reads only"),
    ({**BASE, "endingTimestamp": "5"}, True, "endingTimestamp is for batch reads only"),
    ({**BASE, "startingOffsets": "earliest", "startingTimestamp": "1"}, False, "both set"),
    ({**BASE, "startingTimestamp": "soon"}, False, "startingTimestamp='soon'"),
    ({**BASE, "startingTimestamp": "9", "endingTimestamp": "5"}, False, "before"),
    ({**BASE, "maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger='0'"),
    ({**BASE, "minPartitions": "x"}, False, "minPartitions='x'"),
    ({**BASE, "failOnDataLoss": "yes"}, False, "failOnDataLoss='yes': expected true or false"),
    ({**BASE, "includeProperties": "1"}, False, "includeProperties"),
    ({**BASE, "consumerGroup": "a b"}, True, "option consumerGroup: group name"),
    ({**BASE, "tagExpression": "||"}, False, "option tagExpression"),
    ({**BASE, "pullBatchSize": "5000"}, False, "between 1 and 1024"),
    ({**BASE, "startingOffset": "earliest"}, False, "unknown option(s) startingoffset"),
])
def test_bad_source_options_are_named_with_what_is_accepted(options, streaming, message):
    with pytest.raises(InvalidOption) as raised:
        parse_source_options(options, streaming=streaming)

    assert message in str(raised.value)


def test_spark_generic_options_are_tolerated():
    source(checkpointLocation="/tmp/x", path="ignored")


def test_sink_options():
    options = parse_sink_options({"namesrvAddr": "h:1", "topic": "Out", "sendBatchSize": "10"})

    assert options.topic == "Out" and options.send_batch_size == 10
    assert options.delivery_guarantee is DeliveryGuarantee.AT_LEAST_ONCE


@pytest.mark.parametrize("given", [
    {"exactlyOnce": "true"},
    {"deliveryGuarantee": "exactlyOnce"},
    {"exactlyOnce": "TRUE", "deliveryGuarantee": "exactlyonce"},
])
def test_exactly_once_is_chosen_by_either_option(given):
    options = parse_sink_options({"namesrvAddr": "h:1", **given, "exactlyOnce.timeoutMs": "5000"})

    assert options.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
    assert options.exactly_once_timeout_ms == 5000


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": "Out"}, "namesrvAddr is required"),
    ({"namesrvAddr": "h:1", "topic": "no spaces"}, "option topic: topic name"),
    ({"namesrvAddr": "h:1", "deliveryGuarantee": "twice"}, "atLeastOnce or exactlyOnce"),
    ({"namesrvAddr": "h:1", "exactlyOnce": "yes"}, "exactlyOnce='yes': expected true or false"),
    ({"namesrvAddr": "h:1", "exactlyOnce": "false", "deliveryGuarantee": "exactlyOnce"},
     "contradict"),
    ({"namesrvAddr": "h:1", "exactlyOnce.timeoutMs": "10"}, "exactlyOnce.timeoutMs='10'"),
    ({"namesrvAddr": "h:1", "maxInFlightRequests": "0"}, "maxInFlightRequests='0'"),
    ({"namesrvAddr": "h:1", "subscribe": "x"}, "unknown option(s) subscribe"),
])
def test_bad_sink_options_are_named(options, message):
    with pytest.raises(InvalidOption) as raised:
        parse_sink_options(options)

    assert message in str(raised.value)


def test_credentials_go_together_and_never_show_the_secret():
    options = source(accessKey="spark-app", secretKey="s3cret-value")
    assert options.credentials.access_key == "spark-app"
    assert "s3cret-value" not in repr(options)
    sink = parse_sink_options({"namesrvAddr": "127.0.0.1:9876", "accesskey": "spark-app",
                               "SECRETKEY": "s3cret-value"})
    assert sink.credentials.secret_key == "s3cret-value" and "s3cret-value" not in repr(sink)
    with pytest.raises(InvalidOption, match="accessKey and secretKey go together") as caught:
        source(secretKey="s3cret-value")
    assert "s3cret-value" not in str(caught.value)
    assert source().credentials is None
