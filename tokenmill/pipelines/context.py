"""What the steps of one `tokenmill run` share: the recipe, the work directory, its remote
copy, one Dask client."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.step_graph import Step
from tokenmill.pipelines.workdir import RemoteWorkdir


class Context:
    """What steps share during one run: the recipe, the work directory, one Dask client."""

    def __init__(
        self,
        recipe: Recipe,
        workdir: Path,
        steps: list[Step],
        *,
        scheduler: str | None,
        workers: int | None,
        progress: bool,
        client: Any = None,
    ) -> None:
        self.recipe = recipe
        self.workdir = workdir
        self.steps = {s.name: s for s in steps}
        self.scheduler = scheduler
        self.workers = workers
        self.progress = progress
        self._client_stack: ExitStack | None = None
        self._client: Any = client
        self._own_client = client is None
        self.remote: RemoteWorkdir | None = None  # the work directory's URL, when it has one

    def client(self) -> Any:
        """The Dask client every curation and encoding step shares, opened on first use."""
        if self._client is None:
            from tokenmill.infra.cluster import dask_client

            self._client_stack = ExitStack()
            self._client = self._client_stack.enter_context(dask_client(self.scheduler, self.workers))
        return self._client

    def close_client(self) -> None:
        """Closed before training, so the trainer's processes get the cores."""
        if not self._own_client:
            return
        if self._client_stack is not None:
            self._client_stack.close()
        self._client_stack = None
        self._client = None
