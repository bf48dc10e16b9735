"""The deduplication window of a queue: a message id seen within ``window_ms`` is a duplicate.

Theory of operation
-------------------
Idempotent producers (``producers.py``) catch the retries of *one* producer.
Duplicates sent by *different* producers (an application that re-publishes after
a crash, two senders of the same event) carry the same message id instead, and
the queue drops a message whose id it has seen within the window (as SQS FIFO
queues and Azure Service Bus do). The window runs from the *first* sighting: a
duplicate does not extend it.

Ids live in one insertion-ordered dict, id -> time first seen. Time is passed in
and clamped so it never runs backwards here, so insertion order is time order and
expiring is popping from the front: ``seen`` and ``expire`` are O(1) amortised.

Limit of the guarantee
----------------------
Memory is bounded by ``max_ids`` ids of at most ``ID_BYTES_MAX`` bytes each.
When more than ``max_ids`` distinct ids arrive within one window, the oldest are
forgotten early (counted in ``evicted``) and a duplicate of one of them is no
longer caught. The guarantee is: a duplicate is dropped if it arrives within
``window_ms`` of the first sighting *and* fewer than ``max_ids`` other distinct
ids arrived in between.

Snapshot format (JSON, ``version`` 1)::

    {"version": 1, "clock_ms": int, "ids": [[base64 id, first seen ms], ...]}   oldest first

Everything here is pure: no files, no clock.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict

from fabric.errors import BadParameter

ID_BYTES_MAX = 256
SNAPSHOT_VERSION = 1
SNAPSHOT_BYTES_MAX = 1024 * 1024 * 1024
TIME_MAX = 2**63 - 1


class DedupWindow:
    """Message ids seen in the last ``window_ms``, at most ``max_ids`` of them."""

    def __init__(self, window_ms: int, max_ids: int = 1_000_000) -> None:
        if window_ms <= 0:
            raise ValueError(f"window_ms must be positive, got {window_ms}")
        if max_ids < 1:
            raise ValueError(f"max_ids must be at least 1, got {max_ids}")
        self.window_ms = window_ms
        self.max_ids = max_ids
        self.evicted = 0  # ids forgotten before their window ended, because of max_ids
        self._ids: OrderedDict[bytes, int] = OrderedDict()  # id -> first seen ms, oldest first
        self._clock_ms = -TIME_MAX

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return f"DedupWindow({len(self._ids)} ids, window {self.window_ms} ms, max {self.max_ids})"

    def seen(self, message_id: bytes | bytearray | memoryview, now_ms: int) -> bool:
        """True if ``message_id`` was seen within the window (a duplicate); otherwise remember it."""
        if not message_id or len(message_id) > ID_BYTES_MAX:
            raise BadParameter(f"a message id is 1..{ID_BYTES_MAX} bytes, got {len(message_id)}")
        self.expire(now_ms)
        key = bytes(message_id)
        if key in self._ids:
            return True
        self._ids[key] = self._clock_ms
        if len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)
            self.evicted += 1
        return False

    def contains(self, message_id: bytes | bytearray | memoryview, now_ms: int) -> bool:
        """True if ``message_id`` was seen within the window; unlike ``seen`` it remembers nothing."""
        self.expire(now_ms)
        return bytes(message_id) in self._ids

    def expire(self, now_ms: int) -> int:
        """Forget ids first seen ``window_ms`` or longer ago; return how many."""
        self._clock_ms = max(self._clock_ms, now_ms)
        deadline = self._clock_ms - self.window_ms
        ids, dropped = self._ids, 0
        while ids:
            key, first_ms = next(iter(ids.items()))
            if first_ms > deadline:
                break
            del ids[key]
            dropped += 1
        return dropped

    def snapshot(self) -> bytes:
        """The window as versioned JSON (see the module docstring)."""
        ids = [[base64.b64encode(key).decode("ascii"), ms] for key, ms in self._ids.items()]
        doc = {"version": SNAPSHOT_VERSION, "clock_ms": self._clock_ms, "ids": ids}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def restore(cls, data: bytes, window_ms: int, max_ids: int = 1_000_000) -> DedupWindow:
        """A window from ``snapshot()`` bytes; ``ValueError`` if they are not a valid snapshot.

        ``window_ms`` and ``max_ids`` are the queue's settings now; when
        ``max_ids`` is smaller than the snapshot, the oldest ids go.
        """
        window = cls(window_ms, max_ids)
        if len(data) > SNAPSHOT_BYTES_MAX:
            raise ValueError(f"dedup snapshot of {len(data)} bytes exceeds {SNAPSHOT_BYTES_MAX}")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"dedup snapshot is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"dedup snapshot is not a version {SNAPSHOT_VERSION} object")
        clock, rows = doc.get("clock_ms"), doc.get("ids")
        if type(clock) is not int or not -TIME_MAX <= clock <= TIME_MAX or not isinstance(rows, list):
            raise ValueError("dedup snapshot: bad 'clock_ms' or 'ids'")
        previous = -TIME_MAX
        for row in rows[-max_ids:]:
            if not isinstance(row, list) or len(row) != 2 or not isinstance(row[0], str) or type(row[1]) is not int:
                raise ValueError(f"dedup snapshot: bad entry {row!r:.80}")
            try:
                key = base64.b64decode(row[0], validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"dedup snapshot: id {row[0]!r:.80} is not base64") from None
            ms = row[1]
            if not key or len(key) > ID_BYTES_MAX or key in window._ids or not previous <= ms <= clock:
                raise ValueError(f"dedup snapshot: bad, repeated or out-of-order id {row[0]!r:.80}")
            window._ids[key] = previous = ms
        window._clock_ms = clock
        return window
