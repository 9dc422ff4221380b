"""Runs of JSON rows, answered once their job is saved, with the jobs of several requests saved in one
transaction (docs/ARCHITECTURE.md, "REST details").  Runs in the control plane's server process, on its
event loop.

A run is queued on the event loop itself when the job table and the store are free (``JobMachine.run_now``),
and the jobs queued in one pass of the loop are saved at its end, in one commit, again only when both are
free (``JobMachine.save_now``): no core thread, no hand-over between threads, nothing waited for.  When
either is busy (a core thread committing, an executor reporting), a *round* on a core thread does the rest:
it queues the runs that could not be queued on the loop and saves every job of the round in one transaction.
One round runs at a time; what arrives meanwhile goes to the next."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Unpack

from lancefn_jupyter.server.control.catalog import Where
from lancefn_jupyter.server.control.machine import JobMachine
from lancefn_jupyter.server.control.offload import off_loop

_Outcome = str | BaseException  # a saved job's id, or why its run failed


class Submits:
    def __init__(self, machine: JobMachine) -> None:
        self._machine = machine
        self._queued: list[tuple[Callable[[], str], asyncio.Future]] = []  # runs for the next round to queue
        self._unsaved: list[tuple[str, asyncio.Future]] = []  # jobs queued on the loop, not saved yet
        self._save_armed = False  # a save at the end of this pass of the loop is due
        self._round: asyncio.Task | None = None

    async def run(
        self, name: str, version: str, rows: Any, timeout_s: float | None, *, small: bool, **where: Unpack[Where]
    ) -> str:
        """The job's id once it is saved; the run's error (``ApiError``, a full disk's) if it failed. ``small``: the
        request's body was small enough to parse on the loop (``INLINE_JSON_BYTES``), so its rows are small enough
        to check and write there; a larger one goes to a round whatever its row count."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        job_id = self._machine.run_now(name, version, rows, timeout_s, **where) if small else None
        if job_id is None:
            call = functools.partial(
                self._machine.run, name, version, rows, timeout_s, defer=True, commit_later=True, **where
            )
            self._queued.append((call, future))
        else:
            self._unsaved.append((job_id, future))
        if not self._save_armed and self._round is None:
            self._save_armed = True
            loop.call_soon(self._save)  # after the requests this pass of the loop has read
        return await future

    def _save(self) -> None:
        self._save_armed = False
        if self._round is not None:  # it takes what came meanwhile
            return
        if not self._queued:
            unsaved, self._unsaved = self._unsaved, []
            try:
                failures = self._machine.save_now([job_id for job_id, _ in unsaved])
            except Exception as error:  # a bug of ours: its requests get it (a 500) rather than no answer
                failures = {job_id: error for job_id, _ in unsaved}
            if failures is not None:
                for job_id, future in unsaved:
                    _settle(future, failures.get(job_id, job_id))
                return
            self._unsaved[:0] = unsaved  # busy: the round saves them
        self._round = asyncio.get_running_loop().create_task(self._rounds())

    async def _rounds(self) -> None:
        try:
            while self._queued or self._unsaved:
                queued, self._queued = self._queued, []
                unsaved, self._unsaved = self._unsaved, []
                try:
                    outcomes, failures = await off_loop(
                        self._round_work, [call for call, _ in queued], [job_id for job_id, _ in unsaved]
                    )
                except Exception as error:  # a bug of ours: every request of the round gets it (a 500)
                    outcomes, failures = [error] * len(queued), {job_id: error for job_id, _ in unsaved}
                for (_, future), outcome in zip(queued, outcomes, strict=True):
                    _settle(future, outcome)
                for job_id, future in unsaved:
                    _settle(future, failures.get(job_id, job_id))
        finally:
            self._round = None

    def _round_work(
        self, calls: list[Callable[[], str]], job_ids: list[str]
    ) -> tuple[list[_Outcome], dict[str, BaseException]]:
        """One round (core thread): queue the runs that waited for it, then save every job of the round."""
        outcomes: list[_Outcome] = []
        for call in calls:
            try:
                job_id = call()
            except Exception as error:  # that request's own error (a 400, a 404, a full disk's 507)
                outcomes.append(error)
                continue
            outcomes.append(job_id)
            job_ids.append(job_id)
        failures = self._machine.save_new(job_ids)
        return [failures.get(o, o) if isinstance(o, str) else o for o in outcomes], failures


def _settle(future: asyncio.Future, outcome: _Outcome) -> None:
    if future.done():  # its request went away (the client disconnected); the job is saved all the same
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
