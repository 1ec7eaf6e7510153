"""PULL_MESSAGE's request header, read by the shape its consumer repeats.

A consumer's pulls of one subscription differ only in the queue and the offsets: the group,
the topic, maxMsgNums, sysFlag, suspendTimeoutMillis, subVersion, the subscription and its
expression type are the same texts pull after pull. ``PullRequestReader`` parses those eight
once per shape (by ``PullMessageRequestHeader.from_ext_fields`` itself) and keeps the
result; a later pull of that shape parses only queueId, queueOffset and commitOffset. At
20,000 msg/s the broker reads ~5,600 pulls a second, and the typed header cost ~40 % of a
pull's decode (RESULTS.md, owner pull).

Same answers as the general reader, by construction:

- a shape is kept only after the general reader read a whole header with those eight texts
  (so it parsed them, each independently of the others) and only when they are ``str`` (or
  absent, for the two optional ones): a later key equal to a kept one holds the same texts;
- the three varying fields take the fast path only as plain decimals (the canonical text of
  a small number, or ASCII digits within a Java long), which the general reader reads to the
  same int; anything else (a sign, an empty or missing field, a non-str value, extFields of
  another kind) is handed to the general reader, which reads it or raises the same
  ``HeaderFieldError`` naming the field.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

from tidemq.protocol.headers import SMALL_INT_BY_TEXT, PullMessageRequestHeader

# Shapes kept per reader (a broker's pull processor has one). Each distinct (group, topic,
# subscription, subVersion, ...) of the consumers pulling is one; a client that sent a new
# subVersion every pull would fill it and clear it now and then, no worse than without it.
PULL_SHAPES_KEPT_MAX = 4096

# 18 decimal digits are always within a Java long (10**18 - 1 < 2**63 - 1): no range check.
_DECIMAL_DIGITS_FAST_MAX = 18

_REQUIRED_FIELDS = operator.itemgetter(
    "consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
    "commitOffset", "suspendTimeoutMillis", "subVersion",
)
_MISSING = object()
_small_int = SMALL_INT_BY_TEXT.get
_new = object.__new__
_HEADER = PullMessageRequestHeader


class PullRequestReader:
    """Reads PULL_MESSAGE request headers: ``read(ext)`` gives what
    ``PullMessageRequestHeader.from_ext_fields(ext)`` gives (the same header, or the same
    ``HeaderFieldError``), and for a shape already seen without that parse of every field.

    Not thread-safe; a reader belongs to one event loop (the broker's pull processor).
    """

    __slots__ = ("_shapes",)

    def __init__(self) -> None:
        # the eight texts that stay the same pull after pull -> the header read from them
        self._shapes: dict[tuple[object, ...], PullMessageRequestHeader] = {}

    def read(self, ext: Mapping[str, str] | None) -> PullMessageRequestHeader:
        """The typed header of a pull's extFields (None reads as empty).

        Raises:
            HeaderFieldError: as ``PullMessageRequestHeader.from_ext_fields``.
        """
        try:
            (group, topic, queue_id, queue_offset, max_msg_nums, sys_flag, commit_offset,
             suspend_timeout_millis, sub_version) = _REQUIRED_FIELDS(ext)  # type: ignore[arg-type]
            shape_key = (group, topic, max_msg_nums, sys_flag, suspend_timeout_millis,
                         sub_version, ext.get("subscription"),  # type: ignore[union-attr]
                         ext.get("expressionType"))  # type: ignore[union-attr]
            shape = self._shapes.get(shape_key)
            # The varying three, written out (a helper's call each cost more than its lookup):
            # a small number's canonical text from the table, else plain ASCII digits. A
            # queue id past the table is rare: the general reader reads it.
            queue_id = _small_int(queue_id, _MISSING)
            number = _small_int(queue_offset, _MISSING)
            if number is not _MISSING:
                queue_offset = number
            elif (queue_offset.__class__ is str and queue_offset.isdigit()
                  and queue_offset.isascii() and len(queue_offset) <= _DECIMAL_DIGITS_FAST_MAX):
                queue_offset = int(queue_offset)
            else:
                queue_id = _MISSING
            number = _small_int(commit_offset, _MISSING)
            if number is not _MISSING:
                commit_offset = number
            elif (commit_offset.__class__ is str and commit_offset.isdigit()
                  and commit_offset.isascii() and len(commit_offset) <= _DECIMAL_DIGITS_FAST_MAX):
                commit_offset = int(commit_offset)
            elif commit_offset == "-1":  # the C++ client's "nothing to commit"
                commit_offset = -1
            else:
                queue_id = _MISSING
        except (KeyError, TypeError, AttributeError):  # a field missing or unhashable, ...
            return _HEADER.from_ext_fields(ext)
        if shape is None:
            return self._first_of_shape(ext, shape_key)  # type: ignore[arg-type]
        if queue_id is _MISSING:
            return _HEADER.from_ext_fields(ext)
        # The generated __init__ only stores the fields (headers.py reads them so too).
        header = _new(_HEADER)
        header.consumer_group = shape.consumer_group
        header.topic = shape.topic
        header.queue_id = queue_id
        header.queue_offset = queue_offset
        header.max_msg_nums = shape.max_msg_nums
        header.sys_flag = shape.sys_flag
        header.commit_offset = commit_offset
        header.suspend_timeout_millis = shape.suspend_timeout_millis
        header.subscription = shape.subscription
        header.sub_version = shape.sub_version
        header.expression_type = shape.expression_type
        return header

    def _first_of_shape(self, ext: Mapping[str, str],
                        shape_key: tuple[object, ...]) -> PullMessageRequestHeader:
        """Read ``ext`` by the general reader; keep its shape when its texts are plain."""
        header = _HEADER.from_ext_fields(ext)
        if all(text.__class__ is str for text in shape_key[:6]) and all(
            text is None or text.__class__ is str for text in shape_key[6:]
        ):
            shapes = self._shapes
            if len(shapes) >= PULL_SHAPES_KEPT_MAX:
                shapes.clear()
            shapes[shape_key] = header
        return header
