"""TransactionSettings: the check service's timing and the exactly-once commit cache size."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.broker.config import BrokerConfig

# RocketMQ's BrokerConfig defaults (docs/protocol.md §11.1).
TRANSACTION_TIMEOUT_MS = 6_000  # transactionTimeOut: no check before a half is this old
TRANSACTION_CHECK_INTERVAL_MS = 60_000  # transactionCheckInterval: between checks of a half
TRANSACTION_CHECK_MAX = 15  # transactionCheckMax: then the half is discarded
# exactlyOnceCommitCacheBytes: memory for prepared ranges' committed copies (prepared_ranges.py)
EXACTLY_ONCE_COMMIT_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TransactionSettings:
    """The check service's timing (RocketMQ BrokerConfig keys in brackets).

    Attributes:
        timeout_ms: a half is first checked once this old [transactionTimeOut].
        check_interval_ms: time between checks of one half [transactionCheckInterval].
        check_max: checks sent before a half is discarded [transactionCheckMax].
        commit_cache_bytes: memory for the committed copies of open exactly-once ranges,
            which spare their commit a parse of the halves [exactlyOnceCommitCacheBytes,
            tidemq's own].
    """

    timeout_ms: int = TRANSACTION_TIMEOUT_MS
    check_interval_ms: int = TRANSACTION_CHECK_INTERVAL_MS
    check_max: int = TRANSACTION_CHECK_MAX
    commit_cache_bytes: int = EXACTLY_ONCE_COMMIT_CACHE_BYTES

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> TransactionSettings:
        """The settings of transactionTimeOut, transactionCheckInterval, transactionCheckMax,
        exactlyOnceCommitCacheBytes."""
        return cls(
            timeout_ms=config.transaction_timeout_ms,
            check_interval_ms=config.transaction_check_interval_ms,
            check_max=config.transaction_check_max,
            commit_cache_bytes=config.exactly_once_commit_cache_bytes,
        )
