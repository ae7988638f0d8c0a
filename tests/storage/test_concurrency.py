"""Several threads append/overwrite/read their own groups at once while the WAL
rolls over every few KiB and the segment writer flushes in the background
(real fdatasync). Each thread keeps a reference log; at the end, and after a
restart, storage must equal every reference exactly."""
from __future__ import annotations

import random
import threading
from pathlib import Path

from broker.storage import Entry, LogManager, StorageConfig

from .helpers import Durable, payload, read_all

CFG = StorageConfig(wal_max_size_bytes=6 * 1024, segment_max_entries=4)
THREADS = 4
OPS = 150


def _worker(m: LogManager, gid: str, seed: int, ref: dict[int, Entry],
            failures: list[BaseException]) -> None:
    try:
        rng = random.Random(seed)
        log = m.open_group(gid)
        term = 1
        for _ in range(OPS):
            last = log.last_index()
            if rng.random() < 0.15 and last > 1:
                f = max(log.first_index(), last - rng.randint(0, 8))
                term += 1
            else:
                f = last + 1
            new = [Entry(i, term, payload(gid, i, term)) for i in range(f, f + rng.randint(1, 5))]
            log.append(new)
            for i in [i for i in ref if i >= f]:
                del ref[i]
            ref.update({e.index: e for e in new})
            lo = rng.randint(log.first_index(), log.last_index())
            got = log.entries(lo, log.last_index() + 1)
            assert got == [ref[i] for i in range(lo, log.last_index() + 1)]
            if rng.random() < 0.1:
                m.sync()
    except BaseException as exc:  # reported to the main thread
        failures.append(exc)


def test_concurrent_groups_with_background_rollover(tmp_path: Path) -> None:
    d = Durable()
    refs: dict[str, dict[int, Entry]] = {f"g{n}": {} for n in range(THREADS)}
    failures: list[BaseException] = []
    with LogManager.open(tmp_path, CFG, on_durable=d.on_durable, rng=random.Random(1)) as m:
        threads = [threading.Thread(target=_worker, args=(m, g, n, refs[g], failures))
                   for n, g in enumerate(refs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        m.sync()
        assert m.wait_flushed(30)
        assert m.stats["rollovers"] >= 3
        for g, ref in refs.items():
            log = m._groups[g]
            assert read_all(log) == [ref[i] for i in sorted(ref)]
            assert log.durable_index() == max(ref)
            assert d.latest[g] == (max(ref), ref[max(ref)].term)
    with LogManager.open(tmp_path, CFG) as m:
        for g, ref in refs.items():
            assert read_all(m.open_group(g)) == [ref[i] for i in sorted(ref)]
