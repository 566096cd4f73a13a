"""Dask clients for curation and tokenization: a LocalCluster (one worker process per core) by
default, or an existing cluster given by its scheduler address."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import Any

from tokenmill.errors import TokenmillError

log = logging.getLogger(__name__)

# The address a LocalCluster's servers listen on: this machine only.
LOOPBACK = "127.0.0.1"


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


@functools.cache  # once per process
def guard_expression_singletons() -> None:
    """Close a race in Dask's expression singletons (dask/_expr.py, `SingletonExpr.__new__`).

    It asks ``name in cls._instances`` and then reads ``cls._instances[name]`` from a
    WeakValueDictionary; the instance can die in between. A LocalCluster's scheduler runs in
    the process that submits the graph (the command's, or a test session's), so the submitter's
    expressions, garbage-collected on its thread, are exactly those the scheduler's thread is
    rebuilding from the same graph: now and then a dedup phase failed with ``KeyError:
    'taskshuffle-...'``. This reads the entry once (`get`), as the check means to. Applied only
    where Dask's method has the racy form, so a Dask that fixes it is left alone."""
    import inspect

    try:
        from dask._expr import SingletonExpr
    except ImportError:  # a Dask without expression singletons
        return
    try:
        racy = "if _name in cls._instances" in inspect.getsource(SingletonExpr.__new__)
    except (OSError, TypeError):
        return
    if not racy:
        return
    import weakref

    def __new__(cls, *args, _determ_token=None, **kwargs):  # noqa: N807 - replaces Dask's own
        if not hasattr(cls, "_instances"):
            cls._instances = weakref.WeakValueDictionary()
        inst = super(SingletonExpr, cls).__new__(cls, *args, _determ_token=_determ_token, **kwargs)
        existing = cls._instances.get(inst._name)
        if existing is not None and cls.__init__ == object.__init__:
            return existing
        cls._instances[inst._name] = inst
        return inst

    SingletonExpr.__new__ = staticmethod(__new__)  # as a class body makes it


# How long a command tries to reach a named scheduler before it says it cannot: long enough for
# one that is still starting, short enough that a typo'd address is said soon.
SCHEDULER_CONNECT_TIMEOUT = "10s"


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None) -> Iterator[distributed.Client]:  # noqa: F821
    """Yield a `distributed.Client`.

    `scheduler`: address of a running Dask scheduler (tcp://host:8786). Without it, an explicit
    `workers` starts a LocalCluster of that many single-threaded worker processes; otherwise
    Dask's own `DASK_SCHEDULER_ADDRESS` is used when it is set (as a cluster session or job
    script sets it), else a LocalCluster with one worker per core.
    Single-threaded workers keep per-worker memory predictable and avoid GIL contention in the
    pure-Python parts of the stages.
    """
    from distributed import Client, LocalCluster

    guard_expression_singletons()
    if not scheduler and not workers:
        scheduler = os.environ.get("DASK_SCHEDULER_ADDRESS") or None
    if scheduler:
        try:
            client = Client(scheduler, timeout=SCHEDULER_CONNECT_TIMEOUT)
        except OSError as error:
            raise TokenmillError(f"cannot reach the Dask scheduler at {scheduler}: {error}") from None
        try:
            _redact_worker_logs(client)
            with _client_logs_quiet():
                yield client
        finally:
            with _client_logs_quiet():
                client.close()
        return
    n_workers = workers or default_workers()
    if n_workers < 1:
        raise TokenmillError(f"--workers must be at least 1, got {n_workers}")
    import multiprocessing

    # The processes this cluster starts are the children that appear now: only those are ended
    # with it, never another cluster's or the caller's own.
    children_before = set(multiprocessing.active_children())
    with _sigint_ignored():
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            # The scheduler, the nannies, the workers and the dashboard listen on loopback
            # only, each on a free port (never colliding with another cluster): a dashboard on
            # every interface (Dask's default for ":PORT") shows the cluster's tasks, workers
            # and logs to any host that can reach this one.
            host=LOOPBACK,
            dashboard_address=f"{LOOPBACK}:0",
            # Workers log a failed task ("Compute Failed") or a missed heartbeat with a
            # traceback; the command reports its own failures in one line, and a heartbeat
            # missed under load is retried. --debug shows them.
            silence_logs=logging.ERROR if _debug() else logging.CRITICAL,
        )
    log.debug("Dask dashboard at %s", cluster.dashboard_link)
    interrupted = False
    try:
        client = Client(cluster)
        _redact_worker_logs(client)
        with _client_logs_quiet():
            yield client
    except BaseException:
        interrupted = True
        raise
    finally:
        if interrupted:
            # Stopping on Ctrl-C or an error: workers and nannies log their shutdown (and the
            # tasks they were running) as errors; the user has been told what happened.
            _silence_dask_logs()
            # The workers' work is abandoned: end them at once, before the scheduler goes, so
            # none outlives the command or logs its lost connection.
            _kill_worker_processes(children_before)
        try:
            client.close()
        except (NameError, UnboundLocalError):
            pass  # Client() itself failed
        cluster.close()
        _reap_worker_processes(children_before)


def _redact_worker_logs(client) -> None:  # noqa: ANN001 - a distributed.Client
    """Every worker and nanny of the cluster, now and joining later, redacts URLs in what it
    logs. (This process's own records are redacted by its entry point.)"""
    from tokenmill.infra.worker_logs import PLUGIN_NAME, RedactedNannyLogs, RedactedWorkerLogs

    client.register_plugin(RedactedWorkerLogs(), name=PLUGIN_NAME)
    client.register_plugin(RedactedNannyLogs(), name=PLUGIN_NAME)


def _own_children(children_before: set) -> list:
    import multiprocessing

    return [child for child in multiprocessing.active_children() if child not in children_before]


def _kill_worker_processes(children_before: set) -> None:
    for child in _own_children(children_before):
        child.kill()


def _reap_worker_processes(children_before: set, timeout_s: float = 15.0) -> None:
    """Wait for the LocalCluster's worker processes (the children it started) to exit, killing
    any still there after ``timeout_s``: on a loaded machine `close()` can return while a worker
    is still shutting down, and the command must not end before its workers."""
    import time

    deadline = time.monotonic() + timeout_s
    for child in _own_children(children_before):
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join(5)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT while the LocalCluster spawns its worker processes.

    An ignored signal stays ignored across fork and exec, and Python (and asyncio, which Dask
    workers run under) then installs no KeyboardInterrupt handler, so the workers never see the
    Ctrl-C that a terminal sends to the whole process group: only this process does; it stops
    the stage, closes the cluster and removes the partial output. (A blocked signal mask would
    not do: multiprocessing's spawn clears it.) A Ctrl-C during the second or two of start-up
    is lost; the next one stops the stage.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _debug() -> bool:
    # The CLI sets this for --debug, for the processes a command starts as for itself.
    return os.environ.get("TOKENMILL_DEBUG") == "1"


# The client's loggers that speak of a lost connection (with tracebacks from tornado and
# asyncio); the command says it in one line instead.
_CLIENT_LOGGERS = (
    "distributed.client",
    "distributed.comm",
    "distributed.batched",
    "distributed.core",
    "tornado",
    "asyncio",
)


@contextmanager
def _client_logs_quiet() -> Iterator[None]:
    """Silence, while a client of an existing scheduler is open, what its loggers say of a lost
    connection; --debug leaves them."""
    if _debug():
        yield
        return
    loggers = [logging.getLogger(name) for name in _CLIENT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _silence_dask_logs() -> None:
    for name in ("distributed", "asyncio", "tornado"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def external_scheduler(client) -> str | None:  # noqa: ANN001 - a distributed.Client
    """The address of the client's scheduler when it runs apart from this process (given by
    --scheduler), which can be lost while a command runs; None for a LocalCluster's, which
    lives and ends with the command (once it is closed, nothing listens at its address)."""
    if getattr(client, "cluster", None) is not None:
        return None
    return client.scheduler.address


@contextmanager
def client_or_new(client=None, scheduler: str | None = None, workers: int | None = None):
    """Use the given client, or open one for the duration of the block."""
    if client is not None:
        yield client
        return
    with dask_client(scheduler, workers) as new_client:
        yield new_client


def collect(
    futures: Sized,
    on_result: Callable[[Any, Any], dict[str, Any] | None] | None = None,
    *,
    desc: str,
    unit: str,
    progress: bool,
    total: int | None = None,
    initial: int = 0,
    keep_going: bool = False,
) -> None:
    """Wait for Dask futures in the order they finish, one progress tick each.

    `on_result(future, result)` takes each result; what it returns, if anything, is shown
    beside the bar. Without `on_result` the results are left for the caller to gather. The
    first failure ends the wait, or with `keep_going` is raised once every future has finished,
    so that a rerun after fixing one bad input redoes only what failed.
    """
    from distributed import as_completed

    from tokenmill.progress import progress_bar

    errors: list[BaseException] = []
    total = len(futures) if total is None else total
    with progress_bar(total=total, initial=initial, desc=desc, unit=unit, enabled=progress) as bar:
        for future in as_completed(futures):
            if on_result is None:
                bar.update(1)
                continue
            try:
                result = future.result()
            except Exception as error:
                if not keep_going:
                    raise
                errors.append(error)
                continue
            postfix = on_result(future, result)
            bar.update(1)
            if postfix is not None:
                bar.set_postfix(**postfix)
    if errors:
        raise errors[0]


def submit_and_collect(
    client,
    fn: Callable[..., Any],
    calls: Iterable[tuple[int, tuple[Any, ...]]],
    on_result: Callable[[int, Any], dict[str, Any] | None],
    *,
    desc: str,
    key: str | None = None,
    **wait: Any,
) -> None:
    """Run `fn(*args)` on the cluster for each `(index, args)` of `calls` and take the results
    as they finish: `on_result(index, result)`, with `collect`'s progress bar (`desc`, and its
    other keywords in `wait`). The one loop of every stage's partitions, dedup's per-file
    phases and the encoder's parts. Each task gets its own key (`KEY-RUN-INDEX`, KEY being
    `desc` unless given), so that a rerun never picks up a stale result of an earlier one."""
    prefix = f"{(key or desc).replace(' ', '-')}-{os.urandom(3).hex()}"
    futures = {client.submit(fn, *args, key=f"{prefix}-{index}", pure=False): index for index, args in calls}
    collect(futures, lambda future, result: on_result(futures[future], result), desc=desc, **wait)
