"""Errors of the Spark connector, by who must act.

- ``InvalidOption``: an option of ``spark.read/readStream/write/writeStream.format("tidemq")``
  is missing, unknown or malformed. Raised on the driver before any job runs; the message
  names the option, the value and what is accepted.
- ``DataLossError``: messages a query was to read are gone (retention deleted them, or a
  topic was deleted and re-created). Raised only with ``failOnDataLoss=true`` (the default);
  the message names the queue, the missing offsets and the option to change.
- ``InvalidSinkInput``: the columns or a row given to the sink cannot become messages (no
  body column, a wrong column type, an empty body, a reserved property, an unknown queue).
- ``ExactlyOnceCommitFailed``: an exactly-once batch could not be committed (its rows were
  rolled back by timeout, or a broker refused); nothing of it is visible on that broker.
  Restart the query from its checkpoint: Spark replays the batch.
"""

from __future__ import annotations

from tidemq.errors import ConfigError, TidemqError


class InvalidOption(ConfigError, ValueError):
    """An option of the tidemq data source is missing, unknown or malformed."""


class DataLossError(TidemqError):
    """Messages in the range a query reads are no longer stored (failOnDataLoss=true)."""


class InvalidSinkInput(TidemqError, ValueError):
    """Columns or a row written to the tidemq sink cannot be turned into messages."""


class ExactlyOnceCommitFailed(TidemqError):
    """An exactly-once batch was not committed on a broker; restart the query to replay it."""
