"""tidemq: a persistent, distributed message queue in the design of Apache RocketMQ 4.x."""

__version__ = "0.1.0"
