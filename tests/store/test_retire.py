"""Shrinking in the store: retiring partitions is kept in the queue's record across a restart;
removing them writes the record first, then the directories go (a crash between leaves
directories that opening removes); a later growth starts those partitions empty."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from fabric.errors import BadParameter
from fabric.settings import QueueSettings
from fabric.store.store import Store
from tests.store.helpers import SMALL, fill

EIGHT = dataclasses.replace(SMALL, partitions=8, auto_partitions_max=8, auto_partitions_min=2)


def _open(tmp_path: Path) -> Store:
    return Store(tmp_path, defaults=QueueSettings(), now_ms=0)


def test_retiring_survives_a_restart_and_removal_drops_the_partitions(tmp_path: Path) -> None:
    s = _open(tmp_path)
    s.create_queue("q", EIGHT, now_ms=0)
    fill(s.partition("q", 6), 2)
    with pytest.raises(BadParameter, match="must divide"):
        s.retire_partitions("q", 3)
    s.retire_partitions("q", 4)
    s.retire_partitions("q", 4)  # the same again: a no-op
    with pytest.raises(BadParameter, match="already shrinking"):
        s.retire_partitions("q", 2)
    with pytest.raises(BadParameter, match="shrinking to 4"):
        s.add_partitions("q", 8 * 2, now_ms=0)
    assert s.live_partitions("q") == 4 and s.retiring() == {"q": 4}
    s.close(clean=True)
    s = _open(tmp_path)
    assert s.live_partitions("q") == 4 and s.settings("q").partitions == 8
    assert s.partition("q", 6).next_offset > 0  # still readable while it retires
    shrunk = s.remove_partitions("q")
    assert shrunk.partitions == 4 and s.retiring() == {} and len(s.partitions("q")) == 4
    assert sorted(p.name for p in (tmp_path / "queues" / "q").iterdir()) == ["0", "1", "2", "3"]
    with pytest.raises(BadParameter, match="not shrinking"):
        s.remove_partitions("q")
    s.close(clean=True)
    s = _open(tmp_path)
    assert s.settings("q").partitions == 4 and s.live_partitions("q") == 4
    grown = s.add_partitions("q", 8, now_ms=0)  # it may grow again: the new ones start empty
    assert grown.partitions == 8 and s.partition("q", 6).next_offset == 0
    s.close(clean=False)


def test_a_crash_between_the_record_and_the_directories_is_finished_at_open(tmp_path: Path) -> None:
    s = _open(tmp_path)
    s.create_queue("q", EIGHT, now_ms=0)
    fill(s.partition("q", 5), 2)
    s.retire_partitions("q", 4)
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path / "queues" / "q" / "5", kept)
    s.remove_partitions("q")
    s.close(clean=True)
    shutil.copytree(kept, tmp_path / "queues" / "q" / "5")  # as if the crash came before the removal
    s = _open(tmp_path)
    assert not (tmp_path / "queues" / "q" / "5").exists()
    assert s.add_partitions("q", 8, now_ms=0).partitions == 8 and s.partition("q", 5).next_offset == 0
    s.close(clean=False)


def test_shrinkable_lists_the_queues_above_their_minimum(tmp_path: Path) -> None:
    s = _open(tmp_path)
    s.create_queue("q", EIGHT, now_ms=0)
    s.create_queue("flat", dataclasses.replace(SMALL, partitions=4), now_ms=0)
    s.create_queue("low", dataclasses.replace(EIGHT, partitions=2), now_ms=0)
    s.create_queue("never", dataclasses.replace(EIGHT, auto_partitions_idle_ms=0), now_ms=0)
    assert [n for n, _ in s.shrinkable()] == ["q"]
    s.close(clean=False)
