"""tidemq: a persistent, distributed message queue in the design of Apache RocketMQ 4.x.

The client API is importable from here (``from tidemq import Producer, Message``); it is
loaded on first use, so ``import tidemq.store`` does not pay for the client and asyncio.
Synchronous twins of every client class live in ``tidemq.sync``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_CLIENT_EXPORTS = (
    "Admin",
    "BrokerRejected",
    "ClientStateError",
    "ConsumeFrom",
    "ConsumeResult",
    "Credentials",
    "InvalidMessage",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushStats",
    "RequestTimeout",
    "SendResult",
    "SendStatus",
    "TransactionProducer",
    "TransactionSendResult",
    "TransactionState",
    "reply_message",
    "replying",
    "tls_context",
)

__all__ = ["__version__", *_CLIENT_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _CLIENT_EXPORTS:
        return getattr(importlib.import_module("tidemq.client"), name)
    raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
