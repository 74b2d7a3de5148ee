"""How a parallel launch of int8 products splits into tasks (row_driver.run_jobs, amx_products._run):
each job (one matrix) gives ceil(rows / rows_per_task) tasks of weight rows, numbered
job after job, and every block of activation rows repeats that numbering."""

from __future__ import annotations

import numpy as np

from zinfer.kernels.cpu_fast.code_cache import cached_njit
from zinfer.kernels.cpu_fast.numba_types import Int


@cached_njit(nogil=True, inline="always")
def first_tasks(rows: np.ndarray, rows_per_task: Int) -> np.ndarray:
    """first [n + 1] int64: the number of job j's first task, for jobs of rows [n] weight rows
    (first[n]: the tasks of one block of activation rows)."""
    first = np.zeros(rows.shape[0] + 1, np.int64)
    for j in range(rows.shape[0]):
        first[j + 1] = first[j] + (rows[j] + rows_per_task - 1) // rows_per_task
    return first


@cached_njit(nogil=True, inline="always")
def job_of(first: np.ndarray, c: Int) -> int:
    """The job whose tasks hold task number c (0 <= c < first[-1])."""
    j = 0
    while c >= first[j + 1]:
        j += 1
    return j
