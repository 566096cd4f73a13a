"""The work directory of `tokenmill run`: where it is, one run at a time on it (`WorkdirLock`),
and a work directory on object storage run through a local copy (`RemoteWorkdir`)."""

from __future__ import annotations

import logging
from pathlib import Path

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.lock import PidLock
from tokenmill.infra.outputs import OutputKind, RemoteLock
from tokenmill.infra.slurm import SLURM_DIR
from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.step_graph import STATE_DIR, Step, state_path

log = logging.getLogger(__name__)


# What --workdir may be: an earlier run's work directory (its .state/ and recipe.json), one
# that `tokenmill run --slurm` made for the job it submitted (its slurm/ scripts and logs), or
# nothing yet.
WORKDIR_OUTPUT = OutputKind("a recipe work directory", (STATE_DIR, "recipe.json", SLURM_DIR))


class WorkdirLock(PidLock):
    """One run per work directory at a time: two runs would publish over each other."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(
            workdir / STATE_DIR / "lock",
            lambda holder: TokenmillError(
                f"another tokenmill run (pid {holder}) is using {workdir}; wait for it or use another --workdir"
            ),
        )


def resolve_workdir(path: str | Path) -> str | Path:
    """The work directory as given: an absolute local path, or a URL (see `RemoteWorkdir`)."""
    return storage.Location(path).absolute().native()


def default_workdir(recipe: Recipe) -> str | Path:
    if recipe.workdir:
        return resolve_workdir(recipe.resolve(recipe.workdir))
    return Path.cwd() / f"{recipe.name}-work"


class RemoteWorkdir:
    """A work directory on object storage, run through its local copy in the cache.

    The run starts by taking the lock object ``.state/lock`` with a conditional create (an S3
    PUT with ``If-None-Match: *``: of two runs, exactly one creates it), then brings the local
    copy up to date with the URL. Each finished step is published like any other output: the
    step's state file is removed before it runs, its output files are uploaded (and files of an
    older output that it no longer has removed), and the state file, the mark of a finished
    step, is uploaded last. The lock object is removed when the run ends."""

    LOCK = f"{STATE_DIR}/lock"

    def __init__(self, url: str) -> None:
        self.mirror = storage.Mirror(url, "workdirs")
        self.url, self.local = self.mirror.url, self.mirror.local
        self._lock = RemoteLock(
            f"{self.url}/{self.LOCK}",
            lambda holder: TokenmillError(
                f"another tokenmill run ({holder}) is using {self.url}; wait for it or use another --workdir"
            ),
        )

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def pull(self) -> None:
        """Make the local copy hold what the URL holds. Local state files the URL lacks are removed:
        a step counts as finished only once its state reached the URL."""
        names = [n for n in self.mirror.files() if n != self.LOCK]
        self.mirror.pull(names)
        remote_states = {n for n in names if n.startswith(f"{STATE_DIR}/")}
        for path in (self.local / STATE_DIR).rglob("*.json") if (self.local / STATE_DIR).is_dir() else []:
            if path.relative_to(self.local).as_posix() not in remote_states:
                path.unlink()

    def _name(self, path: Path) -> str:
        return path.relative_to(self.local).as_posix()

    def forget(self, step: Step) -> None:
        """Before a step runs: it stops counting as finished on the URL too."""
        self.mirror.remove(self._name(state_path(self.local, step)))

    def push_step(self, step: Step) -> None:
        """After a step finished: its output files, then its state file."""
        prefix = self._name(step.output)
        files = [self._name(p) for p in sorted(step.output.rglob("*")) if p.is_file() and _published(p)]
        self.mirror.push(files)
        for stale in sorted(set(self.mirror.files(prefix)) - set(files)):
            self.mirror.remove(stale)  # of an older output of this step
        self.mirror.push([], last=[self._name(state_path(self.local, step))])

    def push_files(self, paths: list[Path]) -> None:
        self.mirror.push([self._name(p) for p in paths if p is not None and p.is_file()])

    def push_checkpoint(self, step: Step, run_dir: Path, done: str | None) -> str | None:
        """While a training step runs: upload its newest checkpoint if it is not ``done`` (the one
        uploaded last), with the step's config and fingerprint, so that a rerun on another
        machine resumes the training from it. Returns the checkpoint now on the URL."""
        from tokenmill.train.checkpoint_files import LATEST, RemoteRun

        latest = run_dir / "checkpoints" / LATEST
        name = latest.read_text().strip() if latest.is_file() else None
        if name is None or name == done:
            return done
        try:
            self.mirror.push([self._name(step.output / "config.yaml"), self._name(step.output / "fingerprint")])
            RemoteRun(f"{self.url}/{self._name(run_dir)}", local=run_dir).push(run_dir / "checkpoints" / name)
        except (TokenmillError, OSError) as error:  # pruned by the trainer meanwhile: the next one goes
            log.warning(f"  checkpoint {name} not uploaded yet: {error}")
            return done
        return name


def _published(path: Path) -> bool:
    """Not a lock (the trainer's ``.lock``, an output's ``.NAME.lock``) or a temporary sibling
    (``.NAME.tmp-*``) a writer leaves while it works."""
    return not path.name.endswith(".lock") and not any(part.startswith(".") and ".tmp" in part for part in path.parts)
