"""``tidemq bench consume --latency``: nanosecond send stamps when present, else born time."""

from tidemq.cli.bench_command import SENT_NS_PROPERTY, _latencies_ms
from tidemq.protocol.message import MessageExt


def test_latency_uses_the_nanosecond_send_stamp_and_falls_back_to_born_time():
    now_ns = 1_700_000_000_123_456_789
    stamped = MessageExt("T", b"x", properties={SENT_NS_PROPERTY: str(now_ns - 1_250_000)},
                         born_timestamp=1_700_000_000_000)
    plain = MessageExt("T", b"y", born_timestamp=1_700_000_000_120)
    garbled = MessageExt("T", b"z", properties={SENT_NS_PROPERTY: "soon"},
                         born_timestamp=1_700_000_000_120)
    latencies = _latencies_ms([stamped, plain, garbled], now_ns)
    assert latencies[0] == 1.25  # exact to the nanosecond, not to the millisecond
    assert abs(latencies[1] - 3.456789) < 1e-6
    assert abs(latencies[2] - 3.456789) < 1e-6
