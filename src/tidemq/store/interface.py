"""The message store as the broker sees it: a small interface with two implementations.

``FileMessageStore`` (RocketMQ's layout on disk) and ``MemoryMessageStore`` (the same
behaviour and the same stored bytes, in memory) both implement ``MessageStore``; the
behavioural tests run against both, and broker tests may use the memory twin.

Offsets:
- a *physical offset* is a byte position in the commit log (all topics, one sequence);
- a *queue offset* is the index of an entry in one (topic, queue id) consume queue.
  ``max_offset`` is the next queue offset to be written, ``min_offset`` the first still readable.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field

from tidemq.protocol.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR


class PutStatus(enum.Enum):
    """Outcome of an append (RocketMQ's PutMessageStatus, the subset a broker maps to codes)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"  # stored, but not synced within the timeout
    # SYNC_MASTER (the broker decides these after the put, broker/ha/): stored on the master,
    # but no slave acknowledged it within the timeout / no slave is in sync.
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"  # too large, bad topic or queue; nothing written
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"  # nothing written
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # store closed or not writable
    UNKNOWN_ERROR = "UNKNOWN_ERROR"  # the disk failed the write; see the remark


class GetStatus(enum.Enum):
    """Outcome of ``get_messages`` (docs/protocol.md §4.4 maps each to a response code)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"


@dataclass(slots=True)
class StoreMessage:
    """A message as the broker hands it to the store (after its §6.2 transformations).

    ``properties`` are stored as given (the broker has already removed WAIT and added CLUSTER).
    ``tags_code`` overrides the consume-queue tag code for this append only; leave it None so
    the store derives it from TAGS (or, in SCHEDULE_TOPIC_XXXX, from DELAY and the store time),
    which is also what recovery derives when it rebuilds the consume queues.

    ``properties_text``, when set, is stored as the record's PROPERTIES as it is, and saves
    the store rendering ``properties`` (a broker that has the client's string at hand can
    pass it on). It must say exactly what ``properties`` says, i.e. equal
    ``encode_properties(properties)``: the store still takes TAGS and the index keys from
    ``properties``, while recovery and every reader see the text.
    """

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str]
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    tags_code: int | None = None
    properties_text: str | None = None


@dataclass(slots=True)
class MessageBatch:
    """A batch of one queue in columns, as a broker has it from a SEND_BATCH_MESSAGE body
    (after its §6.2 shaping): message ``i`` is ``bodies[i]``, ``properties[i]``, ``flags[i]``;
    the other fields are the batch's.

    ``properties[i]`` is the record's PROPERTIES as stored (UTF-8, well-formed: each
    ``name\x01value`` once, no empty name or value). ``tags[i]`` and ``keys[i]`` must say
    what it says: its TAGS (``tags`` is None when no message has TAGS) and its index keys,
    UNIQ_KEY then each KEYS token; the store takes the tag codes and index keys from them,
    while recovery and every reader see the stored text. ``prepared_transaction_offsets``
    (None: all 0) gives each record's PREPARED_TRANSACTION_OFFSET: the commit-log offset of
    the half message a committed copy was made from. ``body_crcs`` (None: computed) gives
    each record's BODYCRC as stored, when the caller has it (a copy of a stored record).
    """

    topic: str
    queue_id: int
    bodies: list[bytes]
    properties: list[bytes]
    flags: list[int]
    tags: list[str] | None
    keys: list[Sequence[str]]
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offsets: list[int] | None = None
    body_crcs: list[int] | None = None

    def to_store_messages(self) -> list[StoreMessage]:
        """The same messages one by one, for the general append path."""
        messages: list[StoreMessage] = []
        prepared_offsets = self.prepared_transaction_offsets or [0] * len(self.bodies)
        for body, raw, flag, prepared_offset in zip(
            self.bodies, self.properties, self.flags, prepared_offsets, strict=True
        ):
            text = raw.decode("utf-8")
            properties = dict(
                piece.split(NAME_VALUE_SEPARATOR, 1) for piece in text.split(PROPERTY_SEPARATOR)
            ) if text else {}
            messages.append(StoreMessage(
                self.topic, self.queue_id, body, properties, flag, self.sysflag,
                self.born_timestamp, self.born_host, self.reconsume_times, prepared_offset,
                properties_text=text,
            ))
        return messages


class JoinedMsgIds(Sequence[str]):
    """Msg ids held as one comma-separated text, as a send's answer carries them (its
    ``msgId`` field); split into a list only when read one by one. A batch's answer is
    rendered for all its records with a few string calls and joined with none.

    Equal to a list of the same ids (and to another ``JoinedMsgIds`` of the same text).
    """

    __slots__ = ("_ids", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._ids: list[str] | None = None

    def _split(self) -> list[str]:
        ids = self._ids
        if ids is None:
            ids = self._ids = self.text.split(",") if self.text else []
        return ids

    def __len__(self) -> int:
        return len(self._split())

    def __getitem__(self, index):  # type: ignore[no-untyped-def]  # int or slice, as list's
        return self._split()[index]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._split())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JoinedMsgIds):
            return self.text == other.text
        if isinstance(other, list):
            return self._split() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-like, as a list

    def __repr__(self) -> str:
        return f"JoinedMsgIds({self.text!r})"


def joined_msg_ids(msg_ids: Sequence[str]) -> str:
    """The ids as a send's answer carries them: comma-separated."""
    if isinstance(msg_ids, JoinedMsgIds):
        return msg_ids.text
    return ",".join(msg_ids)


@dataclass(slots=True)
class PutResult:
    """What an append did.

    ``physical_offset`` and ``queue_offset`` are those of the first message; a batch's
    messages follow with consecutive queue offsets. ``msg_ids`` are the offset message ids
    (docs/protocol.md §8.1), one per message (a list, or a ``JoinedMsgIds``: compare and
    read it as a list, answer with ``joined_msg_ids``). Under SYNC_FLUSH ``durable`` is a
    Future that resolves to PUT_OK once the bytes are synced, or FLUSH_DISK_TIMEOUT when
    they were not within ``sync_flush_timeout_ms``; it is None under ASYNC_FLUSH and when
    nothing was written.
    """

    status: PutStatus
    remark: str = ""
    physical_offset: int = -1
    wrote_bytes: int = 0
    queue_offset: int = -1
    msg_ids: Sequence[str] = field(default_factory=list)
    store_timestamp: int = 0
    message_count: int = 0
    durable: Future[PutStatus] | None = None

    @property
    def ok(self) -> bool:
        """True when the messages were appended (whatever their durability)."""
        return self.status is PutStatus.PUT_OK

    def wait_durable(self, timeout_s: float | None = None) -> PutStatus:
        """Block until the append is durable and return the final status.

        Returns ``status`` at once when there is nothing to wait for (ASYNC_FLUSH, or the put
        failed). Returns FLUSH_DISK_TIMEOUT when ``timeout_s`` passes first.
        """
        if self.durable is None:
            return self.status
        try:
            return self.durable.result(timeout_s)
        except FutureTimeoutError:
            return PutStatus.FLUSH_DISK_TIMEOUT


@dataclass(slots=True)
class SendColumns:
    """Single sends of one topic, to any of its queues, in columns: a broker's read of plain
    sends (broker/plain_sends.py). Message ``i`` is what ``put_message_group`` would take as
    ``StoreMessage(topic, queue_ids[i], bodies[i], <properties[i] read back>, flags[i],
    sysflags[i], born_timestamps[i], born_host, properties_text=properties[i])``: one born
    host for all, reconsume times 0, no prepared-transaction offset.

    ``properties[i]`` is the record's PROPERTIES text as stored (each ``name\x01value``
    once, no empty name). ``tags`` and ``keys`` must say what it says, as ``MessageBatch``'s
    do: each message's TAGS (``tags`` is None when no message has TAGS) and its index keys,
    UNIQ_KEY then each KEYS token; the store takes the tag codes and index keys from them,
    while recovery and every reader see the stored text.
    """

    topic: str
    queue_ids: list[int]
    bodies: list[bytes]
    properties: Sequence[str]
    flags: list[int]
    sysflags: list[int]
    born_timestamps: list[int]
    born_host: str
    tags: list[str | None] | None
    keys: Sequence[Sequence[str]]


@dataclass(slots=True)
class SendColumnsPut:
    """What ``put_send_columns`` did, in columns: message ``i`` stored at
    ``physical_offsets[i]`` (``sizes[i]`` bytes), queue offset ``queue_offsets[i]`` of its
    queue, answered with ``msg_ids[i]``: ``msg_id_host`` (the store host's part of an offset
    msg id) followed by ``physical_offsets[i]`` as 16 uppercase hex digits, made only when
    asked for (an answer template writes the two parts itself). Under SYNC_FLUSH ``durable``
    is the group's one future (as each message's result of ``put_message_group`` carries
    it). A status other than PUT_OK (with its remark) means nothing of the group was stored:
    the columns are then empty and ``count`` says how many messages were refused.
    """

    status: PutStatus
    remark: str
    count: int
    physical_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    msg_id_host: str = ""
    store_timestamp: int = 0
    durable: Future[PutStatus] | None = None

    @property
    def msg_ids(self) -> list[str]:
        """Each message's offset msg id (see the class docstring)."""
        host = self.msg_id_host
        return [f"{host}{offset:016X}" for offset in self.physical_offsets]

    def first_result(self) -> PutResult:
        """The first message's ``PutResult``, as ``put_message_group`` gives it."""
        if self.status is not PutStatus.PUT_OK:
            return PutResult(self.status, self.remark)
        return PutResult(PutStatus.PUT_OK, "", self.physical_offsets[0], self.sizes[0],
                         self.queue_offsets[0],
                         [f"{self.msg_id_host}{self.physical_offsets[0]:016X}"],
                         self.store_timestamp, 1,
                         self.durable)

    def put_results(self) -> list[PutResult]:
        """Every message's ``PutResult``, equal to what ``put_message_group`` returns for
        the same messages (for the answers that take one result per send)."""
        if self.status is not PutStatus.PUT_OK:
            return [PutResult(self.status, self.remark) for _ in range(self.count)]
        timestamp = self.store_timestamp
        durable = self.durable
        return [
            PutResult(PutStatus.PUT_OK, "", physical_offset, size, queue_offset, [msg_id],
                      timestamp, 1, durable)
            for physical_offset, size, queue_offset, msg_id in zip(
                self.physical_offsets, self.sizes, self.queue_offsets, self.msg_ids,
                strict=True)
        ]


@dataclass(slots=True)
class GetResult:
    """What ``get_messages`` found: the stored records, as they are, concatenated in ``body``.

    ``next_begin_offset`` is where the consumer should read next (docs/protocol.md §4.4 table);
    ``min_offset`` and ``max_offset`` are the queue's bounds at the time of the read.
    """

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    message_count: int = 0


@dataclass(slots=True)
class QueryResult:
    """Records found by key (newest first), with the index's progress for QUERY_MESSAGE."""

    records: list[bytes]
    index_last_update_timestamp_ms: int
    index_last_update_physical_offset: int

    @property
    def body(self) -> bytes:
        """The records concatenated, as a QUERY_MESSAGE response body."""
        return b"".join(self.records)


# fn(topic, queue_id, max_offset): called after messages were dispatched to that queue.
DispatchListener = Callable[[str, int, int], None]


class MessageStore(abc.ABC):
    """What the broker needs from a message store; nothing more (STYLE rule 2).

    Appends are serialized inside the store; every method may be called from any thread.
    """

    @abc.abstractmethod
    def put_message(self, message: StoreMessage) -> PutResult:
        """Append one message and dispatch it to its consume queue and the index.

        Problems of the message itself (size, topic, properties) are returned as a status
        with a remark, before anything is written; nothing is raised for them.
        """

    @abc.abstractmethod
    def put_messages(self, messages: list[StoreMessage]) -> PutResult:
        """Append a batch (same topic and queue) with consecutive queue offsets in one pass."""

    def put_message_group(self, messages: Sequence[StoreMessage]) -> list[PutResult]:
        """Append messages that are each their own send (any topics and queues), as if
        ``put_message`` were called for each in order; one result per message.

        Sends that arrive together are appended in one pass where the store can (one record
        buffer, one commit-log write, one dispatch); each queue keeps the messages' order,
        and a message the store refuses gets its own status while the others are stored.
        This default puts them one by one.
        """
        return [self.put_message(message) for message in messages]

    def put_send_columns(self, sends: SendColumns) -> SendColumnsPut | None:
        """Append single sends given in columns (see ``SendColumns``) as
        ``put_message_group`` appends the same messages: the same records, consume-queue
        and index entries, in one pass, with the results in columns
        (``SendColumnsPut.put_results`` gives ``put_message_group``'s). None, with nothing
        written, when the store does not take them so; the caller then puts them with
        ``put_message_group``. This default always returns None."""
        return None

    def put_batch(self, batch: MessageBatch, *, msg_ids: bool = True) -> PutResult:
        """Append a batch given in columns (see ``MessageBatch``), as ``put_messages`` would
        append the same messages. ``msg_ids=False``: the caller does not want the result's
        ``msg_ids`` (the store may leave them empty). This default goes through
        ``put_messages``."""
        return self.put_messages(batch.to_store_messages())

    def put_batches(self, batches: Sequence[MessageBatch]) -> list[PutResult]:
        """Append batches (each of one queue, as ``put_batch`` takes it) in order, as if
        ``put_batch`` were called for each; one result per batch, each with its own queue
        offsets and msg ids. A store may append them in one pass (one commit-log write, one
        dispatch); a batch it refuses gets its own status while the others are stored.
        This default puts them one by one."""
        return [self.put_batch(batch) for batch in batches]

    @abc.abstractmethod
    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_codes: Collection[int] | None = None,
    ) -> GetResult:
        """Read up to ``max_count`` messages / ``max_bytes`` bytes from ``offset`` on.

        Args:
            tag_codes: keep only messages whose tag code is in this set; None keeps all.
        The first matching message is returned even when it alone exceeds ``max_bytes``.
        """

    @abc.abstractmethod
    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be written (0 for an unknown queue)."""

    @abc.abstractmethod
    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still readable (0 for an unknown queue)."""

    @abc.abstractmethod
    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The queue offset whose store time is ``timestamp_ms``, else the closest (tie: the
        earlier one); 0 when the queue holds nothing readable (docs/protocol.md §4.12)."""

    @abc.abstractmethod
    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store time (ms) of the first readable message of the queue, or -1 if none."""

    @abc.abstractmethod
    def read_message(self, physical_offset: int) -> bytes | None:
        """The one stored record at ``physical_offset``, or None if no record starts there."""

    @abc.abstractmethod
    def read_records(self, physical_offset: int, size: int) -> bytes | None:
        """The ``size`` stored bytes from ``physical_offset`` on, as one batch append wrote
        them (``PutResult.physical_offset`` and ``wrote_bytes``), or None when no record
        starts there or they are not all in one segment's written part."""

    @abc.abstractmethod
    def query_messages(
        self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int
    ) -> QueryResult:
        """Records of ``topic`` indexed under ``key`` (a KEYS token or a UNIQ_KEY) whose store
        time is in [begin_ms, end_ms], newest first, at most ``max_count``."""

    @abc.abstractmethod
    def commit_log_min_offset(self) -> int:
        """The first physical offset still stored."""

    @abc.abstractmethod
    def commit_log_max_offset(self) -> int:
        """The physical offset the next record will be written at (end of the written log)."""

    @abc.abstractmethod
    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` after each dispatch to a queue.

        It runs on the appending thread after the append lock is released; keep it short.
        """

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when a dispatch listener would be called, but once for an
        append that wrote several queues together (a queue group): for those who need to
        know that the log grew, not which queues did (a master's replication stream).

        It runs on the appending thread after the append lock is released; keep it short.
        This default calls it after each dispatch to a queue.
        """
        self.add_dispatch_listener(lambda _topic, _queue_id, _max_offset: listener())

    def prepare_queue_files(self, topic: str, queue_count: int) -> None:  # noqa: B027
        """Make, in the background, the first files of ``topic``'s queues 0 .. queue_count-1
        that have none, so their first messages do not create files on the caller's thread
        (queue_file_preparer.py). Cheap to call on every send; nothing to do in memory."""

    def prepare_for_writes(self) -> None:  # noqa: B027
        """Make ahead, off the caller's thread where it can, what the first writes would
        otherwise make on it (the first index file, its slot table faulted in: index_file.py;
        the thread that makes new topics' queue files: queue_file_preparer.py).
        The broker calls it at start. Nothing to do in memory.

        Raises:
            StoreFull / StoreError: a file could not be made; writes will say so too.
        """

    @abc.abstractmethod
    def delete_topic(self, topic: str) -> None:
        """Forget the topic's consume queues (its records stay in the commit log until they
        expire); its queues start again at offset 0."""

    @abc.abstractmethod
    def consume_queue_entries(self, topic: str, queue_id: int, queue_offset: int,
                              count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` raw entries (physical offset, size, tag code) of a queue from
        ``queue_offset``, stopping at the first one not stored (an admin's queryCq)."""

    @abc.abstractmethod
    def queue_topics(self) -> set[str]:
        """Every topic that has a consume queue in this store."""

    @abc.abstractmethod
    def clean_expired_consume_queues(self) -> int:
        """Delete consume-queue segments that point only below the commit log's first record
        (what retention does after it deletes segments); return how many were deleted."""

    @abc.abstractmethod
    def run_retention(self, now_ms: int, disk_used_ratio: float | None = None) -> int:
        """Delete expired commit-log segments and what points only into them.

        Args:
            now_ms: the current time (the broker's clock; tests pass a fake one).
            disk_used_ratio: percent of the store's volume in use; None measures it.
        Returns:
            the number of commit-log segments deleted.
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Sync everything written so far (commit log, consume queues, index, checkpoint)."""

    @abc.abstractmethod
    def truncate(self, physical_offset: int) -> None:
        """Cut the commit log at ``physical_offset`` (a record boundary) and drop every
        consume-queue entry that points at or past it (a slave catching up to a new master)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release everything; a clean close makes the next open a normal recovery."""

    def answer_syncs_on_loop(self, add_reader: Callable[[int, Callable[[], None]], None],
                             remove_reader: Callable[[int], bool],
                             answered: Callable[[], None] | None = None) -> bool:
        """Complete SYNC_FLUSH ``durable`` Futures on the caller's event loop (call on its
        thread, with its ``add_reader``/``remove_reader``) rather than on a store thread,
        calling ``answered()`` on the loop after each batch of them completed; returns
        whether the store does so (a store without a sync worker: False)."""
        return False

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
