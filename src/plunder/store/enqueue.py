"""Enqueue: specs checked against the declaration of the job's options (see columns.py),
inserted in as few statements as their options allow, and matched back to their inputs.

In one transaction: (job_id_next, where the store numbers its jobs) ─▶ job_insert per run
of specs with the same options (or one job_insert_mixed) ─▶ job_get_active_by_keys for the
inputs whose key names an active job; repeated while a keyed job finishes meanwhile.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from plunder import errors, payload, tally, tracing
from plunder.model import JobRecord, JobSpec
from plunder.store import columns, limits
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import MAX_ENQUEUE, Engine, insert_mismatch
from plunder.store.fairness import Fairness
from plunder.store.traces import Traces

# Where FreshJobs finds what the insert assigned in a row made for a numbered insert (see
# Enqueue._match_numbered): in the order of columns.ASSIGNED.
_NUMBERED = {name: i for i, name in enumerate(columns.ASSIGNED)}


@dataclass(slots=True)
class Inserts:
    """Specs validated and encoded for ``job_insert``: for each, its options (the dict
    ``columns.spec_settings`` shares between specs that have the same ones) and its own values
    (args, kwargs, key). Ids must follow input order, so each run of specs with the same
    options inserts in one statement that binds them once; a batch with more runs than
    the store allows (``Driver.insert_runs``) inserts in one ``job_insert_mixed`` that binds
    each row's own."""

    settings: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    runs: list[list[int]]
    query: str

    def statements(
        self, done: Container[int]
    ) -> Iterator[tuple[list[int], list[dict[str, Any]], dict[str, Any]]]:
        """For each run with inputs not yet done: those inputs, their rows, and the values
        the statement binds once."""
        for run in self.runs:
            todo = [i for i in run if i not in done]
            if todo:
                common = self.settings[todo[0]] if self.query == "job_insert" else {}
                yield todo, [self.rows[i] for i in todo], common


def inserts(specs: Sequence[JobSpec], runs_allowed: int) -> Inserts:
    """Validate and encode specs (see Inserts); raise before anything is written. Specs made
    from one task's options hold the very same option objects, so a spec like the one
    before it is not looked up again."""
    settings: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    runs: list[list[int]] = []
    before: tuple[Any, ...] = ()
    options: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        values = columns.option_values(spec)
        if not (before and all(map(operator.is_, values, before))):
            found = columns.spec_settings(spec)
            if found is not options:
                runs.append([])
            options = found
        before = values
        settings.append(options)
        row = _own_values(spec)
        row["seq"] = i  # orders the insert: ids follow the input
        rows.append(row)
        runs[-1].append(i)
    if len(runs) <= runs_allowed:
        return Inserts(settings, rows, runs, "job_insert")
    merged = [{**options, **row} for options, row in zip(settings, rows, strict=True)]
    return Inserts(settings, merged, [list(range(len(rows)))], "job_insert_mixed")


def _own_values(spec: JobSpec) -> dict[str, Any]:
    args, kwargs = spec.args, spec.kwargs
    if type(args) is not list:
        if not isinstance(args, list | tuple):
            raise errors.PayloadError(
                f"args of {spec.task!r} must be a list, not {type(args).__name__}"
            )
        args = list(args)
    if not isinstance(kwargs, dict) or (kwargs and not all(isinstance(k, str) for k in kwargs)):
        raise errors.PayloadError(f"kwargs of {spec.task!r} must be a dict with string keys")
    key = spec.key
    return {
        "args": payload.encode(args, what="arguments", of=spec.task) if args else "[]",
        "kwargs": payload.encode(kwargs, what="keyword arguments", of=spec.task)
        if kwargs
        else "{}",
        "key": None if key is None else payload.check_key(key),
    }


class Enqueue:
    """The producers' writes: job_enqueue_many and job_enqueue_ids."""

    def __init__(self, engine: Engine, traces: Traces, fairness: Fairness | None = None) -> None:
        self.engine = engine
        self.traces = traces
        self.driver = engine.driver
        self.limits = limits.Limits(engine)
        self.fairness = fairness

    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[JobRecord]:
        return self._enqueue(specs, conn=conn, now=now, records=True)

    def job_enqueue_ids(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[int]:
        return self._enqueue(specs, conn=conn, now=now, records=False)

    def _enqueue(
        self, specs: Sequence[JobSpec], *, conn: Any, now: Now, records: bool
    ) -> list[Any]:
        if len(specs) > MAX_ENQUEUE:
            raise errors.PayloadError(f"at most {MAX_ENQUEUE} jobs per enqueue, got {len(specs)}")
        batch = inserts(specs, self.driver.insert_runs)
        settings, rows = batch.settings, batch.rows
        if not rows:
            return []
        # where the database delivers NOTIFY, the insert statement sends the wake-up itself
        insert = batch.query + ("_notify" if self.driver.notifies else "")

        def op(tx: Tx) -> list[Any]:
            clock = tx.clock(now)
            fresh: dict[int, Sequence[Any]] = {}  # inputs inserted now: the row returned
            active: dict[int, Row] = {}  # inputs whose key names an active job: that job
            at = _NUMBERED
            if self.driver.numbers_jobs:
                self._number(tx, rows)
            for _ in range(5):  # a keyed job can finish between our insert and our read
                left = list(batch.statements(fresh.keys() | active.keys()))
                for todo, values, common in left:
                    at = self._insert(
                        tx, batch, todo, query=insert, values=values, common=common,
                        clock=clock, fresh=fresh, active=active,
                    )  # fmt: skip
                if not left:
                    break
            else:
                if len(fresh) + len(active) < len(rows):
                    raise errors.StoreBusy("idempotency keys kept changing state during enqueue")
            self._enqueued(tx, specs, clock)
            if not records:
                return [
                    int(fresh[i][at["id"]]) if i in fresh else int(active[i]["id"])
                    for i in range(len(rows))
                ]
            made = columns.FreshJobs(at, self.engine.time)
            return [
                made.job(settings[i], _decoded(specs[i], rows[i]), fresh[i])
                if i in fresh
                else self.engine.job(active[i])
                for i in range(len(rows))
            ]

        # a keyed job inserts once however often this runs; others commit alone, unless limited
        keyed = [bool(row["key"]) for row in rows] + list(map(_writes_again, specs))
        single = not (self.driver.numbers_jobs or any(keyed)) and len(batch.runs) == 1
        return self._run(op, specs, conn, repeatable=all(keyed[: len(rows)]), single=single)

    def _run(
        self, op: Callable[[Tx], list[Any]], specs: Sequence[JobSpec], conn: Any, *,
        repeatable: bool, single: bool,
    ) -> list[Any]:  # fmt: skip
        """``op``, in a "plunder.enqueue" span whose context is stored with the jobs where
        the process traces (plunder.tracing); counted (plunder.tally) once done."""
        with tracing.enqueue_span(specs) as context:
            if context is None:
                made = self.engine.run(op, conn=conn, repeatable=repeatable, single=single)
            else:

                def traced(tx: Tx) -> list[Any]:
                    made = op(tx)
                    ids = [j if isinstance(j, int) else j.id for j in made]
                    self.traces.put(tx, ids, context)
                    return made

                made = self.engine.run(traced, conn=conn, repeatable=repeatable)
        tally.enqueued(specs)
        return made

    def _enqueued(self, tx: Tx, specs: Sequence[JobSpec], clock: Any) -> None:
        """After the inserts: admissions of limited jobs, and fair queues' new groups."""
        self.limits.enqueued(tx, specs, clock)
        if self.fairness is not None:
            self.fairness.enqueued(tx, specs, clock)

    def _number(self, tx: Tx, rows: list[dict[str, Any]]) -> None:
        """Give each row the id it will have (see Driver.numbers_jobs) as its seq: ids
        follow the input order, from the next id of the table."""
        found = tx.one("job_id_next")
        first = 1 if found is None else int(found["id"])
        for i, row in enumerate(rows):
            row["seq"] = first + i

    def _insert(
        self,
        tx: Tx,
        batch: Inserts,
        todo: list[int],
        *,
        query: str,
        values: list[dict[str, Any]],
        common: dict[str, Any],
        clock: Any,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> dict[str, int]:
        """Insert the ``todo`` inputs (their ``values``) with one statement; note each
        input's stored row in ``fresh`` or, where its key was taken, the job holding that
        key in ``active``. Returns where FreshJobs finds what it assigned in a stored row."""
        if self.driver.numbers_jobs:
            count = tx.batch_count(query, values, now=clock, **common)
            self._match_numbered(tx, batch, todo, count, clock, fresh=fresh, active=active)
            return _NUMBERED
        names, inserted = tx.batch_table(query, values, now=clock, **common)
        at = {name: i for i, name in enumerate(names)}
        self._match_inserted(
            tx, batch.rows, batch.settings, todo, (at, inserted), fresh=fresh, active=active
        )
        return at

    def _match_inserted(
        self,
        tx: Tx,
        rows: list[dict[str, Any]],
        settings: list[dict[str, Any]],
        todo: list[int],
        returned: tuple[dict[str, int], list[Sequence[Any]]],
        *,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> None:
        """Pair returned rows with inputs: ids follow input order, and an input was inserted
        unless its key was taken (by an active job, or by an earlier input)."""
        at, inserted = returned
        i_id, i_key, i_task = at["id"], at["key"], at["task"]
        by_id = sorted(inserted, key=lambda r: int(r[i_id]))
        new_keys = {r[i_key] for r in by_id if r[i_key] is not None}
        taken: set[str] = set()
        keyed = []
        position = 0
        for i in todo:
            key = rows[i]["key"]
            if key is None or (key in new_keys and key not in taken):
                if position == len(by_id):
                    insert_mismatch(tx, "enqueue returned fewer rows than it inserted")
                row = by_id[position]
                position += 1
                if row[i_key] != key or row[i_task] != settings[i]["task"]:
                    insert_mismatch(tx, "enqueue returned rows out of input order")
                fresh[i] = row
                if key is not None:
                    taken.add(key)
            else:
                keyed.append(i)
        self._holders(tx, rows, keyed, active)

    def _match_numbered(
        self,
        tx: Tx,
        batch: Inserts,
        todo: list[int],
        count: int,
        clock: Any,
        *,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> None:
        """Which of ``todo`` a numbered insert (see Driver.numbers_jobs) stored: all when it
        inserted as many rows as it was given, else those whose id is now in the table (the
        others' keys were taken). A fresh job's row, for FreshJobs, is made here: what the
        statement assigned (columns.ASSIGNED), as it computed it."""
        rows = batch.rows
        stored: set[int] | None = None
        if count != len(todo):
            found = tx.all(
                "job_claim_state", job_ids=self.engine.list_in([rows[i]["seq"] for i in todo])
            )
            stored = {int(r["id"]) for r in found}
        keyed = []
        assigned: dict[int, tuple[Any, ...]] = {}  # by options: created_at and RELATIVE
        for i in todo:
            seq = rows[i]["seq"]
            if stored is None or seq in stored:
                options = batch.settings[i]
                tail = assigned.get(id(options))
                if tail is None:
                    tail = assigned[id(options)] = _assigned(options, clock)
                fresh[i] = (seq, *tail)
            elif rows[i]["key"] is None:
                raise errors.StoreError(f"enqueue did not store job {seq}, which has no key")
            else:
                keyed.append(i)
        self._holders(tx, rows, keyed, active)

    def _holders(
        self, tx: Tx, rows: list[dict[str, Any]], keyed: list[int], active: dict[int, Row]
    ) -> None:
        """The active job holding each key of ``keyed`` inputs (none when it finished
        meanwhile: the caller inserts those again)."""
        if not keyed:
            return
        keys = sorted({rows[i]["key"] for i in keyed})
        found = {
            r["key"]: r for r in tx.all("job_get_active_by_keys", keys=self.engine.list_in(keys))
        }
        for i in keyed:
            if rows[i]["key"] in found:
                active[i] = found[rows[i]["key"]]


def _writes_again(spec: JobSpec) -> bool:
    """Whether the enqueue writes again after its insert: a limit's admission, a fair
    queue's group row."""
    return spec.limit is not None or spec.group is not None


def _assigned(options: dict[str, Any], clock: Any) -> tuple[Any, ...]:
    """What a numbered insert assigns a job after its id (columns.ASSIGNED): created_at,
    then each RELATIVE column, as the statement computes them from ``clock``."""
    held = options["limit"] is not None  # enqueued held (see plunder.store.limits)
    relative = [
        options[o.name] + limits.HOLD if held and o.name == "delay" else options[o.name]
        for o in columns.RELATIVE
    ]
    return (clock, *(None if seconds is None else clock + seconds for seconds in relative))


def _decoded(spec: JobSpec, row: dict[str, Any]) -> tuple[Any, Any, str | None]:
    """A fresh job's own values as its record holds them: what the stored JSON text of its
    args and kwargs decodes to, and its key."""
    return (
        payload.copy_or_decode(spec.args, row["args"]),
        payload.copy_or_decode(spec.kwargs, row["kwargs"]),
        row["key"],
    )
