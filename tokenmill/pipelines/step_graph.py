"""A recipe becomes an ordered list of steps, each with its inputs, its output and a fingerprint.

Step names say where they sit: `ingest.<source>`, `curate.<source>.<stage>`,
`tokenize.tokenizer`, `tokenize.encode.<source>`, `tokenize.blend`, `train`, `eval`.
`--from/--until/--force` take a step name, a prefix of one (`curate`, `curate.wiki`,
`tokenize`) or a stage name across sources (`langid`).

A step's fingerprint hashes its own config, the fingerprints of the steps it reads (so a
change anywhere upstream reaches everything downstream), the identity of raw input files
(path, size, mtime) and the tokenmill version. A finished step records its fingerprint in
`WORKDIR/.state/<step>.json`; a re-run skips a step whose recorded fingerprint matches and
whose output is still there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenmill import __version__
from tokenmill.curate.chain import per_document
from tokenmill.curate.python_docs import installation_fingerprint
from tokenmill.curate.registry import recipe_stage
from tokenmill.errors import TokenmillError, suggest
from tokenmill.infra import records
from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.schema import ClassifierSpec, CurateStep, Source

STATE_DIR = ".state"


class StepRef(str):
    """A step's name, made only by the constructors below (never by formatting a string), so
    every place that names a step names it the same way. It is a `str`: dict keys, JSON and the
    `--from/--until/--force` patterns see the plain name."""

    @property
    def parts(self) -> list[str]:
        return self.split(".")

    @property
    def last(self) -> str:
        """The step's own name: the source, stage, classifier or section it stands for."""
        return self.parts[-1]

    @classmethod
    def _of(cls, *parts: str) -> StepRef:
        return cls(".".join(parts))

    @classmethod
    def ingest(cls, source: str) -> StepRef:
        return cls._of("ingest", source)

    @classmethod
    def curate(cls, source: str, step: str) -> StepRef:
        return cls._of("curate", source, step)

    @classmethod
    def classifier(cls, name: str) -> StepRef:
        return cls._of("classifier", name)

    @classmethod
    def tokenizer(cls) -> StepRef:
        return cls._of("tokenize", "tokenizer")

    @classmethod
    def encode(cls, source: str) -> StepRef:
        return cls._of("tokenize", "encode", source)

    @classmethod
    def blend(cls) -> StepRef:
        return cls._of("tokenize", "blend")

    @classmethod
    def train(cls) -> StepRef:
        return cls._of("train")

    @classmethod
    def eval(cls) -> StepRef:
        return cls._of("eval")


@dataclass
class Step:
    name: StepRef
    kind: str  # ingest | curate | tokenizer | encode | blend | train | eval
    deps: list[StepRef]
    output: Path
    config: dict[str, Any]
    source: str | None = None
    fingerprint: str = ""
    description: str = ""
    inputs: list[str] = field(default_factory=list)  # human-readable, for the plan
    # The curation steps that run in one pass with this one, in order (`tokenmill.curate.chain`),
    # this one among them; empty for a step that runs alone.
    chain: list[StepRef] = field(default_factory=list)


def curate_steps_for(recipe: Recipe, source: str) -> list[tuple[int, Any]]:
    return [(i, c) for i, c in enumerate(recipe.curate) if c.sources is None or source in c.sources]


def build_plan(recipe: Recipe, workdir: Path) -> list[Step]:
    """The recipe's steps in dependency order, each with its fingerprint: per source its ingest
    and curation, the classifiers, tokenization (tokenizer, encode, blend), train, eval."""
    steps: list[Step] = []
    final_docs: dict[str, Step] = {}  # source -> its last curation step (its ingest if none)
    for source in recipe.sources:
        source_steps = _source_steps(recipe, workdir, source)
        steps += source_steps
        final_docs[source.name] = source_steps[-1]
    steps += [_classifier_step(workdir, spec) for spec in recipe.classifiers]
    if recipe.tokenize is not None:
        steps += _tokenize_steps(recipe, workdir, final_docs)
    if recipe.train is not None:
        steps.append(_train_step(recipe, workdir))
    if recipe.eval is not None:
        steps.append(_eval_step(recipe, workdir))
    steps = _stable_topological(steps)
    _set_fingerprints(steps)
    return steps


def _source_steps(recipe: Recipe, workdir: Path, source: Source) -> list[Step]:
    """A source's ingest step, then its curation steps, each reading the one before; consecutive
    per-document ones run in one pass (`chain`), led by the ingest when `ingest_leads_pass`."""
    steps = [_ingest_step(recipe, workdir, source)]
    for n, (i, c) in enumerate(curate_steps_for(recipe, source.name), start=1):
        steps.append(_curate_step(recipe, workdir, source.name, steps[-1], n, i, c))
    _join_chains(recipe, steps if ingest_leads_pass(recipe, source) else steps[1:])
    return steps


def ingest_leads_pass(recipe: Recipe, source: Source) -> bool:
    """Whether a source's ingest runs as the first link of its pass: when the pass starts with
    extract, ingest would write the raw HTML of every page only for extract to read it once. A
    source that a classifier trains on keeps its ingested documents (the classifier reads them)."""
    first = next((c for _, c in curate_steps_for(recipe, source.name)), None)
    trains_a_classifier = any(source.name in [*c.positive, *c.negative] for c in recipe.classifiers)
    return (
        recipe.chain.fuse
        and first is not None
        and first.stage == "extract"
        and source.format != "python-docs"
        and not trains_a_classifier
    )


def _join_chains(recipe: Recipe, steps: list[Step]) -> None:
    """Set `chain` on the per-document curation steps (and on a leading ingest step): runs of
    consecutive ones when the recipe fuses them, each alone otherwise. A step that waits for
    another step than the one before it (a classifier trained in the run) starts a chain of its
    own, which runs after that step."""
    chain: list[Step] = []
    for step in steps:
        if step.kind != "ingest" and not per_document(recipe_stage(step.config["stage"])):
            chain = []
            continue
        # What the step writes is part of its output, so of its fingerprint.
        step.config["chain"] = recipe.chain.model_dump()
        if not recipe.chain.fuse or len(step.deps) > 1 or not chain:
            chain = []
        chain.append(step)
        for member in chain:
            member.chain = [m.name for m in chain]


def _ingest_step(recipe: Recipe, workdir: Path, source: Source) -> Step:
    config = source.model_dump(exclude={"path"})
    if source.format == "python-docs":
        raw: Any = {"python-docs": installation_fingerprint()}
        inputs = ["python installation (pydoc topics, stdlib docstrings, package METADATA/LICENSE)"]
    else:
        paths = [recipe.resolve(p) for p in source.paths()]
        raw = records.identity(paths)
        config["paths"] = [str(p) for p in paths]
        inputs = [str(p) for p in paths]
    return Step(
        StepRef.ingest(source.name),
        "ingest",
        [],
        workdir / "curate" / source.name / "00-ingest",
        {**config, "raw": raw},
        source=source.name,
        description=f"read {source.format or 'auto'} into Parquet documents",
        inputs=inputs,
    )


def _curate_step(recipe: Recipe, workdir: Path, source: str, previous: Step, n: int, i: int, c: CurateStep) -> Step:
    """The `n`th curation step of `source`, the recipe's `curate[i]` (`c`), reading `previous`."""
    kind = recipe_stage(c.stage)
    options = dict(c.options)
    for option in kind.path_options:
        if isinstance(options.get(option), str):
            options[option] = str(recipe.resolve(options[option]))
        elif isinstance(options.get(option), list):
            options[option] = [str(recipe.resolve(v)) if isinstance(v, str) else v for v in options[option]]
    deps = [previous.name]
    inputs = [str(previous.output)]
    # The stage as written, with its options: the step's fingerprint.
    config: dict[str, Any] = {"stage": c.stage, "options": options, "index": i}
    # Files an option names (a blocklist, a rules file, a task directory) are inputs too: an
    # edited list re-runs the step, as an edited raw file re-runs ingest.
    files = records.identity(
        Path(value)
        for option in kind.input_path_options
        for value in (options.get(option) if isinstance(options.get(option), list) else [options.get(option)])
        if isinstance(value, str)
    )
    if files:
        config["files"] = files
    if c.stage == "classify" and "classifier" in options:
        # A classifier trained in this run: a dependency on it; its model file is found in
        # the work directory at run time, so the fingerprint survives moving the directory.
        config["classifier"] = name = options.pop("classifier")
        deps.append(StepRef.classifier(name))
        inputs.append(str(classifier_model_path(workdir, name)))
    return Step(
        StepRef.curate(source, c.step_name),
        "curate",
        deps,
        workdir / "curate" / source / f"{n:02d}-{c.step_name}",
        config,
        source=source,
        description=f"{c.stage} {json.dumps(c.options, default=str) if c.options else ''}".strip(),
        inputs=inputs,
    )


def _classifier_step(workdir: Path, spec: ClassifierSpec) -> Step:
    sides = [*spec.positive, *spec.negative]
    return Step(
        StepRef.classifier(spec.name),
        "classifier",
        [StepRef.ingest(s) for s in dict.fromkeys(sides)],
        workdir / "classifiers" / spec.name,
        {"positive": spec.positive, "negative": spec.negative, "options": spec.options},
        description=f"train a fastText quality classifier: {', '.join(spec.positive)} (high quality) against"
        f" {', '.join(spec.negative)}",
        inputs=[str(workdir / "curate" / s / "00-ingest") for s in dict.fromkeys(sides)],
    )


def _tokenize_steps(recipe: Recipe, workdir: Path, final_docs: dict[str, Step]) -> list[Step]:
    """The tokenizer (trained on the blended sources' curated documents, or a given file), one
    encode step per blended source (every source without a blend), and the blend."""
    tok = recipe.tokenize
    assert tok is not None
    blended = [b.source for b in recipe.blend] if recipe.blend else [s.name for s in recipe.sources]
    trained_on = [final_docs[s] for s in blended] if not tok.file else []
    tok_config: dict[str, Any] = tok.model_dump()
    if tok.file:
        tok_config["file"] = str(recipe.resolve(tok.file))
        tok_config["raw"] = records.identity([recipe.resolve(tok.file)])
    steps = [
        Step(
            StepRef.tokenizer(),
            "tokenizer",
            [d.name for d in trained_on],
            workdir / "tokenizer",
            tok_config,
            description=f"use {tok.file}" if tok.file else f"train byte-level BPE, vocab {tok.vocab_size}",
            inputs=[str(d.output) for d in trained_on] or [str(tok_config.get("file"))],
        )
    ]
    for name in blended:
        steps.append(
            Step(
                StepRef.encode(name),
                "encode",
                [final_docs[name].name, StepRef.tokenizer()],
                workdir / "shards" / name,
                {},
                source=name,
                description="encode documents into Megatron .bin/.idx shards",
                inputs=[str(final_docs[name].output), str(workdir / "tokenizer" / "tokenizer.json")],
            )
        )
    if recipe.blend:
        steps.append(_blend_step(recipe, workdir))
    return steps


def _blend_step(recipe: Recipe, workdir: Path) -> Step:
    assert recipe.blend
    return Step(
        StepRef.blend(),
        "blend",
        [StepRef.encode(b.source) for b in recipe.blend],
        workdir / "blend",
        {"blend": [b.model_dump() for b in recipe.blend]},
        description="weights per shard: "
        + ", ".join(
            f"{b.source}={'w' + str(b.weight) if b.weight is not None else str(b.epochs) + ' epochs'}"
            for b in recipe.blend
        ),
        inputs=[str(workdir / "shards" / b.source) for b in recipe.blend],
    )


def _train_step(recipe: Recipe, workdir: Path) -> Step:
    train = recipe.train
    assert train is not None
    train_config = train.config if isinstance(train.config, dict) else {"file": str(recipe.train_config_file())}
    layout, world_size = recipe.train_layout(), recipe.train_world_size()
    return Step(
        StepRef.train(),
        "train",
        [StepRef.blend()],
        workdir / "train",
        {"config": train_config, **train.model_dump(exclude={"config", "gpus", "gpu_memory"})},
        description=f"train under torchrun, tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}"
        + (f" cp={layout['cp']}" if layout["cp"] > 1 else "")
        + f" zero={layout['zero']} ({world_size} process{'es' if world_size > 1 else ''})",
        inputs=[str(workdir / "blend" / "blend.json")],
    )


def _eval_step(recipe: Recipe, workdir: Path) -> Step:
    assert recipe.eval is not None
    ev = recipe.eval.model_dump()
    if recipe.eval.data_dir:
        ev["data_dir"] = str(recipe.resolve(recipe.eval.data_dir))
    return Step(
        StepRef.eval(),
        "eval",
        [StepRef.train()],
        workdir / "eval",
        ev,
        description=f"tasks {', '.join(recipe.eval.tasks) or 'none'} x shots {recipe.eval.shots}"
        + ("; held-out perplexity" if recipe.eval.perplexity else ""),
        inputs=[str(workdir / "train" / "run")],
    )


def _set_fingerprints(steps: list[Step]) -> None:
    """Each step's fingerprint, from its name and config and its dependencies' fingerprints
    (`steps` in dependency order), so a change upstream reaches every step downstream."""
    fingerprints: dict[str, str] = {}
    for step in steps:
        step.fingerprint = records.digest(
            {
                "name": step.name,
                "config": step.config,
                "deps": [fingerprints[d] for d in step.deps],
                "version": __version__,
            }
        )
        fingerprints[step.name] = step.fingerprint


def classifier_model_path(workdir: Path, name: str) -> Path:
    return workdir / "classifiers" / name / "model.bin"


def _stable_topological(steps: list[Step]) -> list[Step]:
    """Dependency order that keeps the written order wherever it already allows: a step that
    waits for a later one (a stage using a classifier trained in the run) moves after it."""
    done: set[str] = set()
    pending = list(steps)
    ordered: list[Step] = []
    while pending:
        for i, step in enumerate(pending):
            if all(d in done for d in step.deps):
                ordered.append(pending.pop(i))
                done.add(step.name)
                break
        else:
            raise TokenmillError(
                "the recipe's steps depend on each other in a cycle: " + ", ".join(s.name for s in pending)
            )
    return ordered


# --------------------------------------------------------------------------------------------
# Selection: --from / --until / --force


def match_steps(steps: list[Step], pattern: str, flag: str) -> set[str]:
    names = [s.name for s in steps]
    matched = {n for n in names if n == pattern or n.startswith(pattern + ".") or n.split(".")[-1] == pattern}
    if not matched:
        candidates = sorted({*names, *(n.split(".")[0] for n in names), *(n.split(".")[-1] for n in names)})
        raise TokenmillError(f"{flag} {pattern}: no such step{suggest(pattern, candidates)}; steps: {', '.join(names)}")
    return matched


def descendants(steps: list[Step], roots: set[str]) -> set[str]:
    out = set(roots)
    for step in steps:  # steps are in dependency order
        if any(d in out for d in step.deps):
            out.add(step.name)
    return out


def ancestors(steps: list[Step], roots: set[str]) -> set[str]:
    by_name = {s.name: s for s in steps}
    out: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in out:
            continue
        out.add(name)
        stack.extend(by_name[name].deps)
    return out


@dataclass
class Selection:
    runnable: set[str]  # steps this invocation may run (the rest must already be done)
    forced: set[str]  # steps that run even when their fingerprint is unchanged


def select(steps: list[Step], from_: list[str] | None, until: list[str] | None, force: list[str] | None) -> Selection:
    names = {s.name for s in steps}
    runnable = set(names)
    forced: set[str] = set()
    if until:
        targets = set().union(*(match_steps(steps, u, "--until") for u in until))
        runnable &= ancestors(steps, targets)
    if from_:
        starts = set().union(*(match_steps(steps, f, "--from") for f in from_))
        later = descendants(steps, starts)
        runnable &= later
        forced |= later
    if force:
        roots = set().union(*(match_steps(steps, f, "--force") for f in force))
        forced |= descendants(steps, roots)
    return Selection(runnable, forced & runnable)


def state_path(workdir: Path, step: Step) -> Path:
    return workdir / STATE_DIR / f"{step.name}.json"


def read_state(workdir: Path, step: Step) -> dict[str, Any] | None:
    """The record of the step's last finished run (`infra.records`), of any fingerprint."""
    return records.read_record(state_path(workdir, step))


def is_fresh(workdir: Path, step: Step) -> bool:
    """Whether the step's record is of its current fingerprint and its output is still there."""
    state = records.read_record(state_path(workdir, step), key=step.fingerprint, field="fingerprint")
    return state is not None and step.output.exists()
