"""The round close's job table: every job of the active labs as numpy columns, so that demand,
true needs, block assignment, execution, settlement and the labs' job value are computed for all
labs at once instead of lab by lab.

The table is read from the :class:`~market.core.world.Job` objects once per close and the jobs
that changed are written back at the end (:meth:`JobTable.write_back`); the objects stay the
state of record. The rules are those of :mod:`market.core.execution` (earliest deadline first,
ties by arrival then ``job_id``; a block adds one unit of progress unless it fails; jobs complete
or expire) and every float is computed with the same operands in the same order as the lab-by-lab
code, so episodes replay bit for bit:

- per-job values (``value / size * progress``) are elementwise IEEE operations, the same in numpy
  as in Python;
- a lab's sum over its jobs is taken in job order, one column of a (labs x jobs) matrix at a time
  (:func:`ordered_row_sums`), never by ``np.sum``, whose pairwise order numpy chooses;
- integer sums (blocks, progress) are exact in any order.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from market.core.world import Job, JobStatus, World

PENDING, ACTIVE, DONE, EXPIRED = 0, 1, 2, 3
STATUSES: tuple[JobStatus, ...] = (
    "pending",
    "active",
    "done",
    "expired",
)  # a status code is its index here
_CODE = {name: code for code, name in enumerate(STATUSES)}
_STATUS = attrgetter("status")
_JOB_ID = attrgetter("job_id")


def ordered_row_sums(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per row ``r < n``: the sum of ``values[k]`` with ``rows[k] == r``, added left to right in
    increasing ``cols[k]`` (each (row, col) at most once; absent columns add 0.0, which changes
    no sum). Equal, bit for bit, to Python's ``sum()`` over the same values in that order."""
    out = np.zeros(n)
    if not len(values):
        return out
    width = int(cols.max()) + 1
    grid = np.zeros((n, width))
    grid[rows, cols] = values
    out += grid[:, 0]
    for c in range(1, width):  # one column at a time: the order of a sequential sum
        out += grid[:, c]
    return out


def _edf_order(
    idx: np.ndarray, lab: np.ndarray, deadline: np.ndarray, arrival: np.ndarray, jobs: list[Job]
) -> np.ndarray:
    """The order of jobs ``idx`` by (lab, deadline, arrival, job_id), ids in string order. Labs
    reuse the same few ids, so each id's rank comes from the sorted distinct ids: cheaper than
    sorting every id."""
    ids = list(map(_JOB_ID, map(jobs.__getitem__, idx.tolist())))
    rank = {job_id: r for r, job_id in enumerate(sorted(set(ids)))}
    id_rank = np.fromiter(map(rank.__getitem__, ids), dtype=np.int64, count=len(ids))
    return np.lexsort((id_rank, arrival[idx], deadline[idx], lab[idx]))


@dataclass(slots=True)
class JobTable:
    """The jobs of the active labs, lab by lab in ``active`` order and each lab's jobs in list
    order; one entry per job in every column."""

    jobs: list[Job]
    lab: np.ndarray  # int64: owning lab
    pos: np.ndarray  # int64: index in the lab's job list
    size: np.ndarray  # int64
    progress: np.ndarray  # int64
    status: np.ndarray  # int8: a code of STATUSES
    min_reliability: np.ndarray  # float64
    deadline: np.ndarray  # int64
    arrival: np.ndarray  # int64
    value: np.ndarray  # float64
    realized: np.ndarray  # float64
    partial: np.ndarray  # bool
    n_labs: int
    read_progress: np.ndarray  # progress and status as read, to write back only what changed
    read_status: np.ndarray

    @classmethod
    def read(cls, world: World, active: list[int]) -> JobTable:
        """The table of the active labs' jobs, read from the job objects."""
        labs = world.labs
        counts = np.array([len(labs[i].jobs) for i in active], dtype=np.int64)
        jobs = [j for i in active for j in labs[i].jobs]
        n = len(jobs)
        lab = np.repeat(np.asarray(active, dtype=np.int64), counts)
        pos = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)

        def column(name: str, dtype: type) -> np.ndarray:  # one attribute of every job
            get = attrgetter(name)
            return np.fromiter(map(get, jobs), dtype=dtype, count=n)

        progress = column("progress", np.int64)
        codes = np.fromiter(map(_CODE.__getitem__, map(_STATUS, jobs)), dtype=np.int8, count=n)
        realized = np.zeros(n)  # 0.0 until a job settles: read only the settled jobs'
        settled = np.flatnonzero(codes >= DONE).tolist()
        realized[settled] = [jobs[k].realized for k in settled]
        return cls(
            jobs,
            lab,
            pos,
            column("size", np.int64),
            progress.copy(),
            codes.copy(),
            column("min_reliability", np.float64),
            column("deadline", np.int64),
            column("arrival", np.int64),
            column("value", np.float64),
            realized,
            column("partial_credit", np.bool_),
            len(labs),
            progress,
            codes,
        )

    def runnable(self, reliability: float) -> np.ndarray:
        """Active jobs that ``reliability`` can run (:func:`market.core.execution.runnable`)."""
        live: np.ndarray = (self.status == ACTIVE) & (self.min_reliability <= reliability)
        return live

    def needs(self, reliability: float) -> np.ndarray:
        """Per lab: the remaining units of its runnable jobs (exact integer sums)."""
        live = self.runnable(reliability)
        need = np.zeros(self.n_labs, dtype=np.int64)
        np.add.at(need, self.lab[live], (self.size - self.progress)[live])
        return need

    def refresh(self, labs: list[int]) -> None:
        """Re-read the progress of ``labs``' jobs (run by the lab-by-lab path)."""
        for k in np.flatnonzero(np.isin(self.lab, labs)).tolist():
            self.progress[k] = self.jobs[k].progress

    def edf_assign(
        self, held: np.ndarray, reliability: float, skip: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Earliest-deadline-first assignment of each lab's ``held`` blocks (labs in ``skip``
        excluded): jobs (indices), blocks given and each job's first block's offset in its
        lab's row of failure draws, in assignment order. As
        :func:`market.core.execution.assign_blocks` without a plan: runnable jobs by (deadline,
        arrival, job_id), each given min(remaining, blocks left), jobs given 0 left out."""
        live = self.runnable(reliability) & (held[self.lab] > 0)
        if skip:
            live &= ~np.isin(self.lab, skip)
        idx = np.flatnonzero(live)
        if not idx.size:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        idx = idx[_edf_order(idx, self.lab, self.deadline, self.arrival, self.jobs)]
        lab = self.lab[idx]
        rem = np.maximum(self.size[idx] - self.progress[idx], 0)
        cum = np.cumsum(rem)
        first = np.searchsorted(lab, lab, side="left")  # each lab's first job in ``idx``
        before = cum - rem - (cum[first] - rem[first])  # remaining units of the lab's earlier jobs
        give = np.clip(held[lab] - before, 0, rem)
        offset = np.minimum(before, held[lab])
        keep = give > 0
        return idx[keep], give[keep], offset[keep]

    def run(self, idx: np.ndarray, give: np.ndarray, offset: np.ndarray, ok: np.ndarray) -> None:
        """Run the assigned blocks: job ``idx[k]`` uses blocks ``offset[k]`` to ``offset[k] +
        give[k] - 1`` of its lab's row of ``ok`` (success flags); progress never exceeds size."""
        if not idx.size:
            return
        wins = np.zeros((ok.shape[0], ok.shape[1] + 1), dtype=np.int64)
        np.cumsum(ok, axis=1, out=wins[:, 1:])
        lab = self.lab[idx]
        gained = wins[lab, offset + give] - wins[lab, offset]
        self.progress[idx] = np.minimum(self.size[idx], self.progress[idx] + gained)

    def settle(self, now: int) -> None:
        """:func:`market.core.execution.settle_jobs` for every job: active jobs whose progress
        reached their size are done (realising their value); those due at ``now`` expire
        (realising value x progress / size with partial credit, else nothing)."""
        live = self.status == ACTIVE
        done = live & (self.progress >= self.size)
        expired = live & ~done & (self.deadline <= now)
        self.status[done] = DONE
        self.realized[done] = self.value[done]
        partial = self.value / self.size * self.progress
        self.realized[expired] = np.where(self.partial, partial, 0.0)[expired]
        self.status[expired] = EXPIRED

    def potential(self) -> np.ndarray:
        """Per lab: the sum over its jobs, in list order, of :meth:`Job.potential`."""
        settled = self.status >= DONE
        live = self.status == ACTIVE
        each = np.where(
            settled, self.realized, np.where(live, self.value / self.size * self.progress, 0.0)
        )
        return ordered_row_sums(self.lab, self.pos, each, self.n_labs)

    def write_back(self) -> None:
        """Store changed progress, status and realised value on the job objects."""
        jobs = self.jobs
        moved = np.flatnonzero(self.progress != self.read_progress).tolist()
        for k, progress in zip(moved, self.progress[moved].tolist(), strict=True):
            jobs[k].progress = progress
        settled = np.flatnonzero(self.status != self.read_status).tolist()
        codes = self.status[settled].tolist()
        realized = self.realized[settled].tolist()
        for k, code, value in zip(settled, codes, realized, strict=True):
            job = jobs[k]
            job.status = STATUSES[code]
            job.realized = value
