"""Write errors: a 1 MiB tmpfs fills up under the WAL. The group whose write
failed gets a StorageIOError(ENOSPC) through on_error, nothing durable is
lost, other groups are not blamed, and writes resume once space returns."""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from broker.storage import Entry, HardState, LogManager, StorageConfig, StorageIOError

from .helpers import Durable, fill_disk, payload, read_all, tmpfs

CFG = StorageConfig(wal_max_size_bytes=64 << 20)


@pytest.mark.root
def test_enospc_is_reported_nothing_durable_is_lost_and_writes_resume(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt") as mnt:
        filler = mnt / "filler"
        filler.write_bytes(b"\0" * (256 * 1024))
        d = Durable()
        with LogManager.open(mnt / "node", CFG, on_durable=d.on_durable, on_error=d.on_error) as m:
            a, b = m.open_group("a"), m.open_group("b")
            b.append([Entry(1, 1, payload("b", 1, 1, 100))])
            m.sync()
            i = 0
            while not d.errors:
                assert i < 1000, "the 1 MiB tmpfs never filled up"
                i += 1
                a.append([Entry(i, 1, payload("a", i, 1, 4096))])
                m.sync()
            [(group, exc)] = d.errors
            assert group == "a"
            assert isinstance(exc, StorageIOError) and exc.errno == errno.ENOSPC
            durable = a.durable_index()
            assert durable == i - 1
            # the failed append was dropped: what is served is exactly what is durable
            assert a.last_index() == durable
            assert read_all(a) == [Entry(k, 1, payload("a", k, 1, 4096)) for k in range(1, i)]
            # still full: the retry fails the same way, still only for a
            a.append([Entry(i, 1, payload("a", i, 1, 4096))])
            m.sync()
            assert len(d.errors) == 2 and d.errors[1][0] == "a"
            assert b.durable_index() == 1
            # space returns: writes resume
            filler.unlink()
            a.append([Entry(i, 1, payload("a", i, 1, 4096))])
            m.sync()
            assert a.durable_index() == i
            assert len(d.errors) == 2
        # a restart flushes the WAL into segments, which needs room: a clear error
        # (and nothing deleted) while the disk is full, success once it is grown
        fill_disk(mnt / "filler2")
        with pytest.raises(StorageIOError) as info:
            LogManager.open(mnt / "node", CFG)
        assert info.value.errno == errno.ENOSPC
        subprocess.run(["mount", "-o", "remount,size=4m", str(mnt)], check=True)
        with LogManager.open(mnt / "node", CFG) as m:
            a = m.open_group("a")
            assert read_all(a) == [Entry(k, 1, payload("a", k, 1, 4096)) for k in range(1, i + 1)]
            assert read_all(m.open_group("b")) == [Entry(1, 1, payload("b", 1, 1, 100))]


@pytest.mark.root
def test_segment_flush_waits_for_space_and_keeps_the_wal(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt") as mnt:
        cfg = StorageConfig(wal_max_size_bytes=16 * 1024, segment_max_entries=4096,
                            stagger_first_roll_over=False)
        d = Durable()
        with LogManager.open(mnt / "node", cfg, on_durable=d.on_durable, on_error=d.on_error) as m:
            log = m.open_group("a")
            filler = mnt / "filler"
            fill_disk(filler)
            # room for the WAL, not for a segment file (its index alone is 128 KiB)
            os.truncate(filler, filler.stat().st_size - 64 * 1024)
            i = 0
            while m.stats["rollovers"] == 0:
                i += 1
                log.append([Entry(i, 1, payload("a", i, 1, 100))])
                m.sync()
            written = [Entry(k, 1, payload("a", k, 1, 100)) for k in range(1, i + 1)]
            assert not d.errors  # WAL writes fit; only the background flush is stuck
            assert not m.wait_flushed(1.0)
            assert len(m.wal_files()) == 2
            assert read_all(log) == written and log.durable_index() == i
            filler.unlink()
            assert m.wait_flushed(30)
            assert len(m.wal_files()) == 1 and log.segment_files()
            assert read_all(log) == written
        with LogManager.open(mnt / "node", cfg) as m:
            assert read_all(m.open_group("a")) == written


@pytest.mark.root
def test_opening_a_new_group_on_a_full_disk_is_a_storage_error(tmp_path: Path) -> None:
    """A member started on a full disk (a fault run's disk-full nemesis hit a
    node as it joined a queue): `open_group` reports StorageIOError(ENOSPC),
    the error the node handles by leaving that member stopped. It raised the
    bare OSError before, which stopped the node's metadata group that was
    applying the membership change. The group opens once space returns."""
    with tmpfs(tmp_path / "mnt") as mnt:
        with LogManager.open(mnt / "node", CFG) as m:
            filler = mnt / "filler"
            fill_disk(filler)
            with pytest.raises(StorageIOError) as err:
                m.open_group("late")
            assert err.value.errno == errno.ENOSPC and "late" in str(err.value)
            filler.unlink()
            g = m.open_group("late")
            g.write_bootstrap(b"\x90")
            assert g.read_bootstrap() == b"\x90"


@pytest.mark.root
def test_a_snapshot_on_a_full_disk_is_a_storage_error_and_changes_nothing(tmp_path: Path) -> None:
    """`save_snapshot` let the bare OSError through (an InstallSnapshot write
    in a fault run's disk-full nemesis): now StorageIOError(ENOSPC) like every
    other write, with the previous snapshot still the latest, no tmp file
    left, and a snapshot written once space returns."""
    with tmpfs(tmp_path / "mnt") as mnt:
        with LogManager.open(mnt / "node", CFG) as m:
            g = m.open_group("a")
            g.append([Entry(i, 1, payload("a", i, 1, 100)) for i in range(1, 11)])
            m.sync()
            g.save_snapshot(5, 1, b"cfg", b"small")
            filler = mnt / "filler"
            fill_disk(filler)
            with pytest.raises(StorageIOError) as err:
                g.save_snapshot(10, 1, b"cfg", b"x" * (64 * 1024))
            assert err.value.errno == errno.ENOSPC and "snapshot 10" in str(err.value)
            latest = g.latest_snapshot()
            assert latest is not None and latest.meta.index == 5 and latest.data == b"small"
            snapdir = mnt / "node"
            assert not [p for p in snapdir.rglob("*.tmp")]
            filler.unlink()
            g.save_snapshot(10, 1, b"cfg", b"x" * (64 * 1024))
            latest = g.latest_snapshot()
            assert latest is not None and latest.meta.index == 10


@pytest.mark.root
def test_after_a_failed_write_nothing_builds_on_what_it_dropped(tmp_path: Path) -> None:
    """Between the failed batch and its user hearing of it (on_error reaches
    the user's loop later), the user may still write as if the dropped
    entries were there. The log refuses those writes with the write error: an
    append past its new end (else a gap error, and a member stopped for the
    wrong reason), and a hard state committing beyond it (else a durable
    commit index the durable log does not reach, which no restart can
    accept). Re-appending from durable_index() + 1 is allowed, as before."""
    with tmpfs(tmp_path / "mnt") as mnt:
        d = Durable()
        with LogManager.open(mnt / "node", CFG, on_durable=d.on_durable, on_error=d.on_error) as m:
            a = m.open_group("a")
            a.append([Entry(1, 1, payload("a", 1, 1, 100))])
            a.set_hard_state(HardState(1, "n1", 1))
            m.sync()
            filler = mnt / "filler"
            fill_disk(filler)
            a.append([Entry(i, 1, payload("a", i, 1, 4096)) for i in (2, 3, 4)])
            a.set_hard_state(HardState(1, "n1", 4))
            m.sync()
            assert [g for g, _ in d.errors] == ["a"] and a.durable_index() == 1 == a.last_index()
            with pytest.raises(StorageIOError) as gap:
                a.append([Entry(5, 1, payload("a", 5, 1, 100))])
            assert gap.value.errno == errno.ENOSPC and "append at 5" in str(gap.value)
            with pytest.raises(StorageIOError) as hs:
                a.set_hard_state(HardState(1, "n1", 4))
            assert hs.value.errno == errno.ENOSPC and "commit 4" in str(hs.value)
            assert a.durable_hard_state() == HardState(1, "n1", 1)
            filler.unlink()
            a.append([Entry(2, 1, payload("a", 2, 1, 100))])  # from durable + 1: allowed
            a.set_hard_state(HardState(1, "n1", 2))
            m.sync()
            assert a.durable_index() == 2 and a.durable_hard_state() == HardState(1, "n1", 2)
