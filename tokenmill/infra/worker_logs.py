"""What a Dask worker and its nanny print of themselves goes through `storage.redact`, as the
command's own messages do: a worker logs a failed task with its arguments and traceback, which
may name an input by its URL, credentials and all. Imported by `cluster.dask_client`, with Dask."""

from __future__ import annotations

from distributed import NannyPlugin, WorkerPlugin

from tokenmill.infra.storage import redact
from tokenmill.logs import rewrite_every_record

PLUGIN_NAME = "tokenmill-redacted-logs"


class RedactedWorkerLogs(WorkerPlugin):
    """Installed on every worker of a client's cluster, those that join later included."""

    idempotent = True  # installed once per cluster, however many commands use it

    def setup(self, worker: object) -> None:
        rewrite_every_record(redact)


class RedactedNannyLogs(NannyPlugin):
    """The same in each nanny, a process of its own under `dask worker` (a LocalCluster's
    nannies live in the command's process, whose records its entry point redacts)."""

    idempotent = True

    def setup(self, nanny: object) -> None:
        rewrite_every_record(redact)
