"""tidemq.client: the asyncio Producer, PushConsumer, PullConsumer and Admin (``tidemq.sync``
has twins).

```python
async with Producer("pg", namesrv="127.0.0.1:9876") as producer:
    result = await producer.send(Message("Orders", b"...", tags="paid", keys=["o-42"]))

consumer = PushConsumer("cg", namesrv="127.0.0.1:9876")
consumer.subscribe("Orders", "paid || refunded")

@consumer.listener
def on_messages(messages: list[MessageExt]) -> ConsumeResult:
    return ConsumeResult.SUCCESS
```
"""

from tidemq.client.admin import Admin, DeadLetter
from tidemq.client.admin_types import ConsumeOffset, ConsumeStats, TopicOffset
from tidemq.client.consume_service import PushStats
from tidemq.client.errors import (
    BrokerRejected,
    ClientStateError,
    InvalidMessage,
    InvalidSubscription,
    NameServerUnavailable,
    NoRouteError,
)
from tidemq.client.listener import ConsumeResult, MessageModel
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
from tidemq.client.push_consumer import PushConsumer
from tidemq.client.request_reply import RequestTimeout, reply_message, replying
from tidemq.client.route import BrokerData, ClusterInfo, QueueData, TopicRouteData
from tidemq.client.security import Credentials, tls_context
from tidemq.client.transaction_producer import (
    TransactionProducer,
    TransactionSendResult,
    TransactionState,
)
from tidemq.protocol.message import MessageExt

__all__ = [
    "Admin",
    "BrokerData",
    "BrokerRejected",
    "ClientStateError",
    "ClusterInfo",
    "ConsumeFrom",
    "ConsumeOffset",
    "ConsumeResult",
    "ConsumeStats",
    "Credentials",
    "DeadLetter",
    "InvalidMessage",
    "InvalidSubscription",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "NameServerUnavailable",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushStats",
    "QueueData",
    "RequestTimeout",
    "SendResult",
    "SendStatus",
    "TopicOffset",
    "TopicRouteData",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "reply_message",
    "replying",
    "tls_context",
]
