"""Run lm-evaluation-harness offline on the shared benchmark files, for side-by-side checks.

Each reference task is the harness's own YAML (`include:`) with only the data source replaced by
local JSON files; PIQA's separate labels file and BoolQ's true/false answers are first written
into the `label` field that the harness's datasets carry. The tasks of data ablations (ARC,
OpenBookQA, Social IQa, COPA, CommonsenseQA, WSC273) read files in their Hugging Face schemas,
rebuilt from the shared ICL files (`hub_exports.py`), which both tools read as they are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .hub_exports import write_hub_exports

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DISABLE_MULTIPROC", "1")

# Each of our tasks: its harness task YAML, under lm_eval/tasks.
HARNESS_YAMLS = {
    "lambada_openai": "lambada/lambada_openai.yaml",
    "piqa": "piqa/piqa.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "winogrande": "winogrande/default.yaml",
    "race": "race/race.yaml",
    "anli_r1": "anli/anli_r1.yaml",
    "anli_r2": "anli/anli_r2.yaml",
    "anli_r3": "anli/anli_r3.yaml",
    "wic": "super_glue/wic/default.yaml",
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "social_iqa": "siqa/siqa.yaml",
    "copa": "super_glue/copa/default.yaml",
    "commonsense_qa": "commonsense_qa/default.yaml",
    "wsc273": "wsc273/default.yaml",
}
# The harness's split keys, for the splits a local file gives.
SPLIT_KEYS = {"train": "training_split", "validation": "validation_split", "test": "test_split"}


def harness_yaml(path: Path) -> dict:
    """A harness task YAML with its `include:` chain applied (`!function` values kept as text)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    config = yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 - SafeLoader subclass
    if "include" in config:
        return {**harness_yaml(path.parent / config["include"]), **config}
    return config


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_reference_tasks(eval_dir: Path, out: Path, n_exported: int = 40) -> dict[str, tuple[str, Path]]:
    """Write `tm_<task>.yaml` files into `out` (and the exported files of the ablation tasks,
    `n_exported` evaluated rows each, into `out/exports`); returns our task name -> (harness
    task name, the data directory tokenmill reads it from)."""
    import lm_eval

    tasks_root = Path(lm_eval.__file__).parent / "tasks"
    out.mkdir(parents=True, exist_ok=True)
    piqa = _read_jsonl(eval_dir / "piqa_valid.jsonl")
    labels = (eval_dir / "piqa_valid-labels.lst").read_text().split()
    piqa_file = _write_jsonl(out / "piqa_valid.jsonl", [{**d, "label": int(label)} for d, label in zip(piqa, labels)])
    boolq = _read_jsonl(eval_dir / "boolq_dev.jsonl")
    boolq_file = _write_jsonl(out / "boolq_dev.jsonl", [{**d, "label": int(d["answer"])} for d in boolq])
    # Split roles as our local-file reader sees them (no train file -> validation is the pool).
    data = {
        "lambada_openai": ({"test": eval_dir / "lambada_openai_test.jsonl"}, {}),
        "piqa": ({"validation": piqa_file}, {"training_split": None}),
        "boolq": ({"validation": boolq_file}, {"training_split": None}),
        "winogrande": (
            {"train": eval_dir / "winogrande_train_xs.jsonl", "validation": eval_dir / "winogrande_dev.jsonl"},
            {},
        ),
    }
    data_dirs = dict.fromkeys(data, eval_dir)
    exports = write_hub_exports(eval_dir / "icl", out / "exports", n_exported)
    for ours, files in exports.items():
        # Only the splits exported: a split the YAML names but the files lack is switched off.
        data[ours] = (dict(files), {key: None for split, key in SPLIT_KEYS.items() if split not in files})
        data_dirs[ours] = out / "exports"
    names = {}
    for ours, (files, overrides) in data.items():
        yaml_rel = HARNESS_YAMLS[ours]
        lines = [
            f"include: {tasks_root / yaml_rel}",
            f"task: tm_{ours}",
            "tag: null",
            "dataset_path: json",
            "dataset_name: null",
            "dataset_kwargs:",
            "  data_files:",
            *[f"    {split}: {path}" for split, path in files.items()],
            *[f"{key}: {'null' if value is None else value}" for key, value in overrides.items()],
        ]
        (out / f"tm_{ours}.yaml").write_text("\n".join(lines) + "\n")
        names[ours] = (f"tm_{ours}", data_dirs[ours])
    return names


def run_harness(
    model_dir: Path, task_dir: Path, tasks: list[str], shots: int, limit: int, batch_size: int
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on a local transformers directory; returns its results dict."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={model_dir},dtype=float32",
        tasks=tasks,
        num_fewshot=shots,
        limit=limit,
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
        task_manager=TaskManager(include_path=str(task_dir)),
    )


def per_request(samples: list[dict[str, Any]]) -> list[tuple[int, list[tuple[str, str]], list[tuple[float, bool]]]]:
    """(doc_id, request arguments, (loglikelihood, is_greedy) per request) for each logged doc."""
    out = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        args = [tuple(a[:2]) for a in s["arguments"]]
        resps = [tuple(r[0]) if isinstance(r, list) else tuple(r) for r in s["resps"]]
        out.append((s["doc_id"], args, [(float(ll), bool(g)) for ll, g in resps]))
    return out
