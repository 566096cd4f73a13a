"""Evaluation suites: a YAML file naming ICL tasks, their files and settings, scored together and
aggregated as DCLM aggregates CORE (the mean of the tasks' centered accuracies).

The bundled `core` suite (`suites/core.yaml`) is DCLM's CORE. A suite whose files are not all
under the data directory runs the tasks it has; its aggregate is then labelled with the count
(`CORE (18/22)`), never as the suite's own, and the results name the tasks that ran and those
that did not. `load_suite_data` reads every file before a model is loaded; `score_suite` runs the
tasks on a loaded model adapter (a checkpoint, a transformers directory, or weights in memory).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenmill.errors import TokenmillError
from tokenmill.eval.icl import Example, IclTask, IclTaskResult, read_examples, score_task

if TYPE_CHECKING:
    from tokenmill.eval.models import TokenLM

log = logging.getLogger(__name__)

BUNDLED_SUITES = ("core",)
_TASK_KEYS = {
    "label",
    "file",
    "icl_task_type",
    "num_fewshot",
    "continuation_delimiter",
    "example_delimiter",
    "prompt_string",
    "fewshot_random_seed",
    "random_baseline",
}


@dataclass(frozen=True)
class Suite:
    name: str
    aggregate: str
    tasks: tuple[IclTask, ...]


@dataclass
class SuiteData:
    """A suite's tasks whose files were found, their examples, and the tasks left out."""

    suite: Suite
    examples: dict[str, list[Example]]
    files: dict[str, str]
    missing: list[str] = field(default_factory=list)

    @property
    def present(self) -> list[IclTask]:
        return [t for t in self.suite.tasks if t.label in self.examples]


@dataclass
class SuiteResult:
    suite: Suite
    tasks: list[IclTaskResult]
    missing: list[str]

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def aggregate_label(self) -> str:
        """The suite's aggregate name, with the count of tasks that ran when some did not."""
        if self.complete:
            return self.suite.aggregate
        return f"{self.suite.aggregate} ({len(self.tasks)}/{len(self.suite.tasks)})"

    @property
    def aggregate_value(self) -> float:
        return sum(r.centered_accuracy for r in self.tasks) / len(self.tasks)

    def summary(self) -> str:
        """One line saying what the aggregate is over."""
        ran = f"{self.suite.aggregate} over {len(self.tasks)} of {len(self.suite.tasks)} tasks"
        if self.complete:
            return f"{ran}: {self.aggregate_value:.4f}"
        return f"{ran}: {self.aggregate_value:.4f} (not {self.suite.aggregate}: {', '.join(self.missing)} did not run)"


def _task_from_entry(entry: Any, where: str) -> IclTask:
    if not isinstance(entry, dict):
        raise TokenmillError(f"{where}: a task is a mapping with label, file, icl_task_type, ...")
    unknown = sorted(set(entry) - _TASK_KEYS)
    if unknown:
        raise TokenmillError(f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(sorted(_TASK_KEYS))}")
    for key in ("label", "file", "icl_task_type"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise TokenmillError(f"{where}: {key} must be a non-empty string")
    label = entry["label"]
    shots = entry.get("num_fewshot", 0)
    if isinstance(shots, list) and len(shots) == 1:  # llm-foundry writes [k]
        shots = shots[0]
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise TokenmillError(f"{where} ({label}): num_fewshot must be an integer >= 0, got {shots!r}")
    texts = {}
    for key in ("continuation_delimiter", "example_delimiter", "prompt_string"):
        if key in entry:
            if not isinstance(entry[key], str):
                raise TokenmillError(f"{where} ({label}): {key} must be a string")
            texts[key] = entry[key]
    baseline = entry.get("random_baseline", 0)
    if isinstance(baseline, bool) or not isinstance(baseline, (int, float)) or not 0 <= baseline < 100:
        raise TokenmillError(f"{where} ({label}): random_baseline is a percentage in [0, 100), got {baseline!r}")
    seed = entry.get("fewshot_random_seed", 1234)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TokenmillError(f"{where} ({label}): fewshot_random_seed must be an integer")
    return IclTask(
        label=label,
        file=entry["file"],
        task_type=entry["icl_task_type"],
        num_fewshot=shots,
        fewshot_seed=seed,
        random_baseline=float(baseline),
        **texts,
    )


def load_suite(name_or_path: str | Path) -> Suite:
    """A bundled suite by name (`core`) or a suite YAML file."""
    import yaml

    if str(name_or_path) in BUNDLED_SUITES:
        source = f"bundled suite {name_or_path}"
        text = resources.files("tokenmill.eval").joinpath(f"suites/{name_or_path}.yaml").read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise TokenmillError(
                f"suite {name_or_path!r} is neither a bundled suite ({', '.join(BUNDLED_SUITES)}) nor a file"
            )
        source, text = str(path), path.read_text(encoding="utf-8")
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TokenmillError(f"{source}: not YAML ({' '.join(str(error).split())})") from error
    if not isinstance(spec, dict) or not isinstance(spec.get("tasks"), list) or not spec["tasks"]:
        raise TokenmillError(f"{source}: a suite is a mapping with a non-empty `tasks` list")
    tasks = tuple(_task_from_entry(entry, f"{source}: tasks[{i}]") for i, entry in enumerate(spec["tasks"]))
    labels = [t.label for t in tasks]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise TokenmillError(f"{source}: task {repeated[0]!r} is listed twice")
    name = str(spec.get("name") or Path(str(name_or_path)).stem)
    return Suite(name=name, aggregate=str(spec.get("aggregate") or name), tasks=tasks)


def load_suite_data(suite: Suite, data_dir: str | Path | None) -> SuiteData:
    """Read the files of a suite's tasks under `data_dir`; a missing file is named in a warning
    and its task left out; no file at all is an error."""
    if data_dir is None:
        raise TokenmillError(f"suite {suite.name}: pass --data-dir, the folder its task files are under")
    root = Path(data_dir)
    if not root.is_dir():
        raise TokenmillError(f"data directory {root} does not exist")
    data = SuiteData(suite, {}, {})
    absent = [task for task in suite.tasks if not (root / task.file).is_file()]
    if len(absent) == len(suite.tasks):
        raise TokenmillError(f"suite {suite.name}: none of its {len(suite.tasks)} task files is under {root}")
    for task in suite.tasks:
        path = root / task.file
        if task in absent:
            log.warning(f"suite {suite.name}: task {task.label}: {path} not found; the task is left out")
            data.missing.append(task.label)
            continue
        data.examples[task.label] = read_examples(path, task)
        data.files[task.label] = str(path)
    return data


def score_suite(
    model: TokenLM, data: SuiteData, limit: int | float | None = None, batch_size: int = 16, progress: bool = True
) -> SuiteResult:
    """Every present task of a suite on a loaded model; `limit` examples per task."""
    results = [score_task(model, task, data.examples[task.label], limit, batch_size, progress) for task in data.present]
    return SuiteResult(data.suite, results, list(data.missing))


def suite_rows(result: SuiteResult, data: SuiteData, model_name: str, seconds: float) -> list[dict[str, Any]]:
    """Result rows: acc and centered_acc per task, then the aggregate (its note says what it is over)."""
    from tokenmill.eval.metrics import mean_stderr

    rows: list[dict[str, Any]] = []
    centered_errors: list[float | None] = []
    for task_result in result.tasks:
        task = task_result.task
        values = [float(c) for c in task_result.correct]
        stderr = mean_stderr(values)
        scale = 1.0 - task.random_baseline / 100.0
        common = {
            "task": task.label,
            "shots": task.num_fewshot,
            "n": len(values),
            "model": model_name,
            "data_hash": _file_hash(data.examples[task.label]),
            "data_files": [data.files[task.label]],
            "icl_task_type": task.task_type,
            "random_baseline": task.random_baseline,
        }
        rows.append({**common, "metric": "acc", "value": task_result.accuracy, "stderr": stderr})
        centered_errors.append(None if stderr is None else stderr / scale)
        rows.append(
            {**common, "metric": "centered_acc", "value": task_result.centered_accuracy, "stderr": centered_errors[-1]}
        )
    # The aggregate's sampling error, the tasks' examples drawn independently (not seed noise).
    known = [e for e in centered_errors if e is not None]
    aggregate_error = math.sqrt(sum(e * e for e in known)) / len(known) if len(known) == len(centered_errors) else None
    rows.append(
        {
            "task": result.aggregate_label,
            "shots": None,
            "n": None,
            "metric": "centered_acc",
            "value": result.aggregate_value,
            "stderr": aggregate_error,
            "model": model_name,
            "suite": result.suite.name,
            "complete": result.complete,
            "tasks": [r.task.label for r in result.tasks],
            "missing_tasks": list(result.missing),
            "seconds": round(seconds, 3),
            "note": result.summary(),
        }
    )
    return rows


def _file_hash(examples: list[Example]) -> str:
    import json

    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(example, sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def evaluate_suite(
    model: TokenLM, data: SuiteData, limit: int | float | None = None, batch_size: int = 16, progress: bool = True
) -> list[dict[str, Any]]:
    """Score a suite and return its result rows (what `tokenmill eval --suite` prints)."""
    start = time.perf_counter()
    result = score_suite(model, data, limit, batch_size, progress)
    log.info(result.summary())
    return suite_rows(result, data, model.name, time.perf_counter() - start)
