"""Dask clients for curation: a LocalCluster (one worker process per core) by default, or an
existing cluster given by its scheduler address."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from tokenmill.errors import TokenmillError


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None) -> Iterator["distributed.Client"]:  # noqa: F821
    """Yield a `distributed.Client`.

    `scheduler`: address of a running Dask scheduler (tcp://host:8786); None starts a
    LocalCluster with `workers` single-threaded worker processes (default: one per core).
    Single-threaded workers keep per-worker memory predictable and avoid GIL contention in the
    pure-Python parts of the stages.
    """
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as error:
            raise TokenmillError(f"cannot reach the Dask scheduler at {scheduler}: {error}") from None
        try:
            yield client
        finally:
            client.close()
        return
    n_workers = workers or default_workers()
    if n_workers < 1:
        raise TokenmillError(f"--workers must be at least 1, got {n_workers}")
    cluster = LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",  # a free port: never collide with another cluster
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@contextmanager
def client_or_new(client=None, scheduler: str | None = None, workers: int | None = None):
    """Use the given client, or open one for the duration of the block."""
    if client is not None:
        yield client
        return
    with dask_client(scheduler, workers) as new_client:
        yield new_client
