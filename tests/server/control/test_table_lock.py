"""The job table's lock counts the threads waiting for it and knows how long the longest has waited, which a batch's
slices read to end early once a waiter is past the grace (docs/ARCHITECTURE.md, "Batches")."""

from __future__ import annotations

import threading
import time

import pytest

from lancefn_jupyter.server.control.jobtable import TableLock

pytestmark = pytest.mark.unit


def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_waiters_are_counted_while_they_wait_and_the_owner_reenters_freely():
    lock = TableLock()
    got: list[str] = []
    with lock:
        with lock:  # re-entrant: the owner is never a waiter
            assert lock.waiting == 0
        threads = [threading.Thread(target=lambda i=i: _take(lock, got, i)) for i in range(3)]
        for thread in threads:
            thread.start()
        _wait_for(lambda: lock.waiting == 3)
        assert got == []  # none got in while it was held
    for thread in threads:
        thread.join(5)
    assert sorted(got) == ["0", "1", "2"] and lock.waiting == 0


def _take(lock: TableLock, got: list[str], i: int) -> None:
    with lock:
        got.append(str(i))


def test_an_exception_inside_releases_the_lock():
    lock = TableLock()
    with pytest.raises(RuntimeError), lock:
        raise RuntimeError("boom")
    done = threading.Event()
    threading.Thread(target=lambda: (lock.__enter__(), done.set(), lock.__exit__())).start()
    assert done.wait(5)


def test_a_waiter_is_overdue_once_it_has_waited_the_grace_and_not_after_it_got_in():
    lock = TableLock(grace_s=3600.0)
    got: list[str] = []
    with lock:
        assert not lock.overdue()  # nobody waits
        waiter = threading.Thread(target=_take, args=(lock, got, 0))
        waiter.start()
        _wait_for(lambda: lock.waiting == 1)
        assert not lock.overdue()  # waiting, within an hour's grace
        lock.grace_s = 0.0
        assert lock.overdue()  # the same waiter, past a grace of 0
    waiter.join(5)
    assert got == ["0"] and lock.waiting == 0 and not lock.overdue()
