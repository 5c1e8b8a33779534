"""The instance's garbage-collector settings: start-up objects frozen, full collections counted."""
from __future__ import annotations

import gc

from llumnix.cluster.gc_watch import GCWatch, freeze_startup_objects


def test_full_collections_are_counted_and_frozen_objects_skipped(monkeypatch):
    watch = GCWatch()
    try:
        gc.collect(1)  # not a full collection
        assert watch.num_full == 0
        gc.collect()
        assert watch.num_full == 1 and watch.full_s > 0 and watch.max_full_s == watch.full_s
        monkeypatch.setenv("LLUMNIX_GC_FREEZE", "0")
        assert freeze_startup_objects() == 0
        monkeypatch.delenv("LLUMNIX_GC_FREEZE")
        try:
            assert freeze_startup_objects() > 0 and watch.stats()["frozen"] == gc.get_freeze_count()
            assert watch.num_full == 2  # the collection before freezing
        finally:
            gc.unfreeze()
    finally:
        watch.close()
    gc.collect()
    assert watch.num_full == 2  # closed: no longer counting
