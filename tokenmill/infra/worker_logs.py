"""What a Dask worker prints of itself goes through `storage.redact`, as the command's own
messages do: a worker logs a failed task with its arguments and traceback, which may name an
input by its URL, credentials and all. Imported by `cluster.dask_client`, with Dask."""

from __future__ import annotations

from distributed import WorkerPlugin

from tokenmill.infra.storage import redact
from tokenmill.logs import rewrite_every_record

PLUGIN_NAME = "tokenmill-redacted-logs"


class RedactedWorkerLogs(WorkerPlugin):
    """Installed on every worker of a client's cluster, those that join later included."""

    def setup(self, worker: object) -> None:
        rewrite_every_record(redact)
