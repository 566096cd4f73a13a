"""Benchmark decontamination: remove training documents that share a word n-gram (default 13,
as GPT-3 and MT-NLG did) with the text of evaluation tasks.

Eval tasks are JSONL files (any schema): `--task [NAME=]PATH[:FIELD,FIELD...]`; without fields
every string value of a record is eval text. Each eval string is normalized like the documents
(lower-case, punctuation to spaces, whitespace collapsed) and cut into n-grams, hashed with
XXH64 into one sorted table (8 bytes per distinct n-gram: LAMBADA + PIQA + WinoGrande + BoolQ
is a few MB). Workers build the table once per process from the files (so the files must be
readable by the workers) and look up every n-gram of every document with a binary search.
A document that matches is rejected as `contaminated:<task>` with the first matched n-gram in
`matched_ngram`. Eval strings shorter than n words contribute nothing (counted in the stats),
as in GPT-3's procedure.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from tokenmill.curate.dedup.shingles import ShingleConfig, encode_batch, parse_normalization
from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, PartitionTask, StageOptions, reject, run_stage
from tokenmill.errors import ConfigError, TokenmillError
from tokenmill.infra import storage

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

HASH_SEED = 13


@dataclass(frozen=True)
class EvalTask:
    name: str
    path: str
    fields: tuple[str, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> EvalTask:
        """`[NAME=]PATH[:FIELD,FIELD...]`; NAME defaults to the file name without extensions."""
        name = None
        if "=" in spec:
            name, spec = spec.split("=", 1)
        fields: tuple[str, ...] = ()
        path = spec
        # The last ':' separates fields, unless it belongs to a URL's scheme or the path exists.
        if ":" in spec.split("://", 1)[-1] and not storage.exists(spec):
            path, field_list = spec.rsplit(":", 1)
            fields = tuple(f.strip() for f in field_list.split(",") if f.strip())
        if not storage.isfile(path):
            raise TokenmillError(f"eval task file not found: {path}")
        return cls(name or storage.basename(path).split(".")[0], storage.absolute(path), fields)

    def texts(self) -> list[str]:
        out: list[str] = []
        with io.TextIOWrapper(storage.open_input(self.path), encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise TokenmillError(f"{self.path}:{number}: not valid JSON ({error})") from None
                if not isinstance(record, dict):
                    raise TokenmillError(f"{self.path}:{number}: a JSON object is expected")
                if self.fields:
                    missing = [f for f in self.fields if f not in record]
                    if missing and number == 1:
                        raise TokenmillError(
                            f"{self.path}: field(s) {', '.join(missing)} not in the records (have {', '.join(record)})"
                        )
                    values = [record.get(f) for f in self.fields]
                else:
                    values = list(record.values())
                out.extend(v for v in values if isinstance(v, str) and v.strip())
        return out


def _ngram_config(ngram: int, normalize: str) -> ShingleConfig:
    return ShingleConfig(ngram=ngram, mode="word", normalization=parse_normalization(normalize))


def _long_enough(normalized: list[str], ngram: int) -> np.ndarray:
    import numpy as np

    return np.array([bool(t) and t.count(" ") + 1 >= ngram for t in normalized], dtype=bool)


@dataclass
class NgramTable:
    hashes: np.ndarray  # sorted unique uint64
    task_of: np.ndarray  # int32, the first task (in the order given) holding each n-gram
    task_names: list[str]
    stats: dict[str, dict[str, int]]


def build_table(tasks: tuple[EvalTask, ...], ngram: int, normalize: str) -> NgramTable:
    import numpy as np

    from tokenmill.curate.dedup.hashing import shingle_hashes_batch  # numba: loaded by a run

    config = _ngram_config(ngram, normalize)
    all_hashes, all_tasks, stats = [], [], {}
    for index, task in enumerate(tasks):
        texts = task.texts()
        batch = encode_batch(texts, config)
        ok = _long_enough(batch.texts, ngram)
        hashes, offsets, _, _ = shingle_hashes_batch(
            batch.buf, batch.offsets, batch.kinds, ngram, ngram, np.uint64(HASH_SEED)
        )
        keep = np.repeat(ok, np.diff(offsets))
        unique = np.unique(hashes[keep])
        all_hashes.append(unique)
        all_tasks.append(np.full(unique.size, index, np.int32))
        stats[task.name] = {"texts": len(texts), "too_short": int((~ok).sum()), "ngrams": int(unique.size)}
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, np.uint64)
    task_of = np.concatenate(all_tasks) if all_tasks else np.zeros(0, np.int32)
    # Stable sort by hash, first occurrence wins: an n-gram shared by tasks goes to the first.
    order = np.argsort(hashes, kind="stable")
    hashes, task_of = hashes[order], task_of[order]
    first = np.ones(hashes.size, dtype=bool)
    first[1:] = hashes[1:] != hashes[:-1]
    return NgramTable(hashes[first], task_of[first], [t.name for t in tasks], stats)


@lru_cache(maxsize=4)
def _cached_table(tasks: tuple[EvalTask, ...], ngram: int, normalize: str) -> NgramTable:
    return build_table(tasks, ngram, normalize)


@dataclass
class Decontaminate(StageOptions):
    """Task files (JSONL, `[NAME=]PATH[:FIELD,...]`, or `EvalTask`s) and/or, in a recipe, a
    directory whose every `.jsonl` file is a task (the benchmark data directory of `eval`)."""

    tasks: list[str | EvalTask] | None = option(
        None,
        flag="--task",
        path=True,
        cli={"action": "append", "required": True, "metavar": "[NAME=]PATH[:FIELD,...]"},
        help="an eval JSONL file; repeat for several. Without fields, every string field is eval text",
    )
    data_dir: str | None = option(
        None, cli=False, path=True, help="a directory whose every .jsonl file is an eval task"
    )
    ngram: int = option(13, help="words per n-gram (default 13)")
    normalize: str = option(
        "lower,punct",
        help="comma list of lower, punct, nfkc, or none, applied to both sides before n-grams (default lower,punct)",
    )
    fields: list[str] | None = option(
        None,
        parse=lambda value: [f for f in value.split(",") if f] or None,
        help="comma list of fields for tasks that name none",
    )
    # The tasks, parsed (names, absolute paths, fields), from `tasks` and `data_dir`.
    eval_tasks: tuple[EvalTask, ...] = field(init=False, repr=False)

    name = "decontaminate"

    def __post_init__(self) -> None:
        parsed = tuple(
            t if isinstance(t, EvalTask) else EvalTask.parse(t)
            for t in decontamination_tasks(self.tasks, self.data_dir)
        )
        if self.fields:
            parsed = tuple(EvalTask(t.name, t.path, t.fields or tuple(self.fields)) for t in parsed)
        names = [t.name for t in parsed]
        if len(set(names)) != len(names):
            raise ConfigError(f"eval task names must be unique, got {names}; name them with NAME=PATH")
        if self.ngram < 1:
            raise ConfigError(f"--ngram must be >= 1, got {self.ngram}")
        parse_normalization(self.normalize)
        self.eval_tasks = parsed

    def manifest_config(self) -> dict:
        return {
            "tasks": [vars(t) | {"fields": list(t.fields)} for t in self.eval_tasks],
            "ngram": self.ngram,
            "normalize": self.normalize,
        }

    def partitions(self, input: Any) -> list[PartitionTask]:
        # The table before any worker starts: a bad task file fails the stage at once.
        _cached_table(self.eval_tasks, self.ngram, self.normalize)
        return super().partitions(input)

    def finalize(self, manifest: dict[str, Any]) -> None:
        manifest["eval_tasks"] = _cached_table(self.eval_tasks, self.ngram, self.normalize).stats

    def process(self, docs: pd.DataFrame) -> Batch:
        import numpy as np
        import pandas as pd

        from tokenmill.curate.dedup.hashing import shingle_hashes_batch  # numba: loaded by a run

        table = _cached_table(self.eval_tasks, self.ngram, self.normalize)
        batch = encode_batch(docs["text"].fillna("").astype(str).tolist(), _ngram_config(self.ngram, self.normalize))
        hashes, offsets, starts, ends = shingle_hashes_batch(
            batch.buf, batch.offsets, batch.kinds, self.ngram, self.ngram, np.uint64(HASH_SEED)
        )
        long_enough = np.repeat(_long_enough(batch.texts, self.ngram), np.diff(offsets))
        if table.hashes.size:
            pos = np.searchsorted(table.hashes, hashes)
            pos = np.minimum(pos, table.hashes.size - 1)
            hit = (table.hashes[pos] == hashes) & long_enough
        else:
            pos, hit = np.zeros(hashes.size, np.int64), np.zeros(hashes.size, bool)
        doc_of = np.repeat(np.arange(len(docs)), np.diff(offsets))
        hit_idx = np.flatnonzero(hit)
        # The first matching n-gram of each document.
        first_docs, first_at = np.unique(doc_of[hit_idx], return_index=True)
        matched = np.zeros(len(docs), dtype=bool)
        matched[first_docs] = True
        reasons = np.empty(len(docs), dtype=object)
        ngrams = np.empty(len(docs), dtype=object)
        buf = batch.buf.tobytes()
        for d, k in zip(first_docs.tolist(), hit_idx[first_at].tolist()):
            reasons[d] = f"contaminated:{table.task_names[table.task_of[pos[k]]]}"
            ngrams[d] = buf[starts[k] : ends[k]].decode("utf-8")
        rejected = reject(docs[matched], pd.Series(reasons[matched], index=docs.index[matched], dtype=object))
        rejected["matched_ngram"] = ngrams[matched]
        n_matches = np.bincount(doc_of[hit_idx], minlength=len(docs))
        rejected["matched_ngrams"] = n_matches[matched]
        return Batch(
            n_in=len(docs), kept=docs[~matched], rejected=rejected, stats={"ngrams_checked": int(long_enough.sum())}
        )


def run_decontaminate(
    input,
    output,
    tasks: list[str] | list[EvalTask],
    *,
    ngram: int = 13,
    normalize: str = "lower,punct",
    fields: list[str] | None = None,
    **runner,
) -> dict:
    """Decontaminate `input` against eval tasks (`Decontaminate`'s options) into `output`."""
    stage = Decontaminate(tasks=list(tasks), ngram=ngram, normalize=normalize, fields=fields)
    return run_stage(stage, input, output, **runner)


REASONS = {
    "contaminated:": "shares a {ngram}-word n-gram with the text of this eval task (matched_ngram)",
}


def decontamination_tasks(tasks: list[str] | None, data_dir: str | None) -> list[str]:
    out = list(tasks or [])
    if data_dir:
        out += [name for name, relative in storage.list_files(data_dir, ".jsonl") if "/" not in relative]
    if not out:
        raise ConfigError("decontaminate needs `tasks` (JSONL files) or a `data_dir` holding .jsonl task files")
    return out


STAGES = (
    Stage(
        "decontaminate",
        Decontaminate,
        help="remove documents sharing a 13-gram with evaluation task text",
        description="Reject documents that share a word n-gram with the text of eval tasks "
        "(reason contaminated:<task>, matched n-gram in matched_ngram).",
    ),
)
