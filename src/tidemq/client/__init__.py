"""tidemq.client: the asyncio Producer, PullConsumer and Admin (``tidemq.sync`` has twins).

```python
async with Producer("pg", namesrv="127.0.0.1:9876") as producer:
    result = await producer.send(Message("Orders", b"...", tags="paid", keys=["o-42"]))
```
"""

from tidemq.client.admin import Admin, ConsumeOffset, ConsumeStats, TopicOffset
from tidemq.client.errors import (
    BrokerRejected,
    ClientStateError,
    InvalidMessage,
    InvalidSubscription,
    NameServerUnavailable,
    NoRouteError,
)
from tidemq.client.message import (
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from tidemq.client.producer import Producer
from tidemq.client.pull_consumer import ConsumeFrom, PullConsumer
from tidemq.client.route import BrokerData, ClusterInfo, QueueData, TopicRouteData
from tidemq.protocol.message import MessageExt

__all__ = [
    "Admin",
    "BrokerData",
    "BrokerRejected",
    "ClientStateError",
    "ClusterInfo",
    "ConsumeFrom",
    "ConsumeOffset",
    "ConsumeStats",
    "InvalidMessage",
    "InvalidSubscription",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NameServerUnavailable",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "QueueData",
    "SendResult",
    "SendStatus",
    "TopicOffset",
    "TopicRouteData",
]
