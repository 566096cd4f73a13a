"""What each kind of step does (`RUNNERS`, by `Step.kind`) and how its result is summed up in
one line. Training, which supervises a process of its own, is in `training.py`."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import replace
from typing import Any

from tokenmill.errors import TokenmillError
from tokenmill.infra.atomic import atomic_dir
from tokenmill.pipelines.context import Context
from tokenmill.pipelines.step_graph import Step, StepRef, classifier_model_path
from tokenmill.pipelines.training import run_training

log = logging.getLogger(__name__)


def _ingest(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.curate.ingest import ingest

    source = ctx.recipe.source(step.source or "")
    extra: dict[str, Any] = {}
    paths, options = _source_files(ctx, source)
    if source.format == "python-docs":
        from tokenmill.curate.python_docs import build_corpus

        corpus = ctx.workdir / "sources" / source.name / "corpus.jsonl"
        log.info(f"  assembling the python-docs corpus -> {corpus}")
        extra = build_corpus(corpus, source.max_documents)
        paths, options = [str(corpus)], {**options, "format": "jsonl", "id_field": "id"}
    manifest = ingest(paths, step.output, client=ctx.client(), progress=ctx.progress, **options)
    if extra:
        manifest["python_docs"] = extra
        (step.output / "python-docs.json").write_text(json.dumps(extra, indent=2) + "\n")
    return manifest


def _source_files(ctx: Context, source: Any) -> tuple[list[str], dict[str, Any]]:
    """A recipe source's raw files and the ingest options they are read with."""
    options = {
        "format": source.format,
        "text_field": source.text_field,
        "id_field": source.id_field,
        "source": source.name,
        "separator": source.separator,
    }
    return [str(ctx.recipe.resolve(p)) for p in source.paths()], options


def _curate(ctx: Context, step: Step) -> dict[str, Any]:
    kind, config = _stage_options(ctx, step)
    upstream = ctx.steps[step.deps[0]].output
    if getattr(config, "index", None) and hasattr(config, "index_owner"):
        # A dedup index: what this step added to it is replaced when the step reruns (--from,
        # --force, a changed upstream), instead of being found there as duplicates of itself.
        where = ctx.remote.url if ctx.remote is not None else str(ctx.workdir)
        config = replace(config, index_owner=f"{where}#{step.name}")
    return kind.execute(config, str(upstream), step.output, client=ctx.client(), progress=ctx.progress)


def _stage_options(ctx: Context, step: Step) -> tuple[Any, Any]:
    """A curation step's stage and its options object."""
    from tokenmill.curate.registry import recipe_stage

    kind = recipe_stage(step.config["stage"])
    options = dict(step.config["options"])
    if "classifier" in step.config:
        options["model"] = str(classifier_model_path(ctx.workdir, step.config["classifier"]))
    return kind, kind.recipe_options(options)


def curate_in_one_pass(ctx: Context, steps: list[Step], replay: list[Step]) -> list[dict[str, Any]]:
    """Run consecutive curation steps of one chain in one pass, after `replay`, the steps of the
    chain before them whose outputs are up to date but hold no kept documents (they run again in
    memory, writing nothing); returns the manifests of `steps`. A pass led by its source's ingest
    reads the source's raw files."""
    from tokenmill.curate.chain import run_stages

    members = [*replay, *steps]
    first = members[0]
    if first.kind == "ingest":
        from tokenmill.curate.ingest import IngestStage
        from tokenmill.curate.registry import all_stages

        input, options = _source_files(ctx, ctx.recipe.source(first.source or ""))
        leader = [(all_stages()["ingest"], IngestStage(**options))]
    else:
        input, leader = str(ctx.steps[first.deps[0]].output), [_stage_options(ctx, first)]
    spec = ctx.recipe.chain
    return run_stages(
        [*leader, *(_stage_options(ctx, member) for member in members[1:])],
        input,
        [member.output for member in members],
        replay=len(replay),
        rejected=spec.rejected,
        keep_intermediate=spec.keep_intermediate,
        client=ctx.client(),
        progress=ctx.progress,
    )


def _classifier(ctx: Context, step: Step) -> dict[str, Any]:
    """Train the quality classifier on the ingested positive and negative sources."""
    from tokenmill.curate.classifier import train_classifier

    positive = [str(ctx.steps[StepRef.ingest(s)].output) for s in step.config["positive"]]
    negative = [str(ctx.steps[StepRef.ingest(s)].output) for s in step.config["negative"]]
    name = step.name.last
    with atomic_dir(step.output) as tmp:
        meta = train_classifier(positive, negative, tmp / "model.bin", **step.config["options"])
    assert classifier_model_path(ctx.workdir, name).exists()
    return meta


def _tokenizer(ctx: Context, step: Step) -> dict[str, Any]:
    spec = ctx.recipe.tokenize
    assert spec is not None
    target = step.output / "tokenizer.json"
    with atomic_dir(step.output) as tmp:
        if spec.file:
            shutil.copyfile(ctx.recipe.resolve(spec.file), tmp / "tokenizer.json")
        else:
            from tokenmill.tokenize.tokenizer import train_tokenizer

            inputs = [str(ctx.steps[d].output) for d in step.deps]
            log.info(f"  training a byte-level BPE (vocab {spec.vocab_size}) on {len(inputs)} curated source(s)")
            train_tokenizer(
                inputs,
                spec.vocab_size,
                tmp / "tokenizer.json",
                sample_docs=spec.sample_docs,
                progress=ctx.progress,
                **spec.options,
            )
    from tokenmill.tokenize.tokenizer import load_tokenizer, tokenizer_hash, vocab_size

    return {
        "path": str(target.relative_to(ctx.workdir)),
        "vocab_size": vocab_size(load_tokenizer(target)),
        "hash": tokenizer_hash(target),
    }


def _encode(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.tokenize.encode import encode_documents

    docs = ctx.steps[step.deps[0]].output
    tokenizer = ctx.steps[StepRef.tokenizer()].output / "tokenizer.json"
    step.output.mkdir(parents=True, exist_ok=True)
    # The encoder resumes from the partitions under PREFIX.parts/, so the prefix is stable.
    return encode_documents(str(docs), tokenizer, step.output / step.source, client=ctx.client(), progress=ctx.progress)


def blend_weights(entries: list[dict[str, Any]], tokens: dict[str, int]) -> dict[str, float]:
    """Normalised weights; `epochs: e` means e passes over the source's tokens, so its weight
    is proportional to e x tokens (MT-NLG gives some sources in epochs, others in weight).
    Mixing both: weights are shares of the stream and the epoch sources take their share."""
    epoch_tokens = {e["source"]: e["epochs"] * tokens[e["source"]] for e in entries if e.get("epochs") is not None}
    weighted = {e["source"]: e["weight"] for e in entries if e.get("weight") is not None}
    if not weighted:
        total = sum(epoch_tokens.values())
        return {k: v / total for k, v in epoch_tokens.items()}
    if not epoch_tokens:
        total = sum(weighted.values())
        return {k: v / total for k, v in weighted.items()}
    # Weighted sources fill the stream the epoch sources leave; scale by their token shares.
    w_total = sum(weighted.values())
    weighted_tokens = sum(tokens[k] for k in weighted)
    stream = sum(epoch_tokens.values()) + weighted_tokens
    shares = {k: v / stream for k, v in epoch_tokens.items()}
    rest = 1.0 - sum(shares.values())
    shares.update({k: rest * v / w_total for k, v in weighted.items()})
    return {e["source"]: shares[e["source"]] for e in entries}  # in the recipe's order


def _blend(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.tokenize.encode import read_shard_metadata

    entries = step.config["blend"]
    prefixes = {e["source"]: ctx.steps[StepRef.encode(e["source"])].output / e["source"] for e in entries}
    tokens = {name: int(read_shard_metadata(p)["tokens"]) for name, p in prefixes.items()}
    empty = [name for name, n in tokens.items() if n == 0]
    if empty:
        raise TokenmillError(f"blend: source(s) {', '.join(empty)} have no tokens left after curation")
    weights = blend_weights(entries, tokens)
    # Prefixes relative to blend.json (as `load_blend_file` reads them), so the work directory can move.
    blend = [
        {"prefix": os.path.relpath(prefixes[name], step.output), "weight": round(weights[name], 12)}
        for name in prefixes
    ]
    info = {"requested": entries, "weights": weights, "tokens": tokens}
    with atomic_dir(step.output) as tmp:
        (tmp / "blend.json").write_text(json.dumps(blend, indent=2) + "\n")
        (tmp / "blend-info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _eval(ctx: Context, step: Step) -> dict[str, Any]:
    from tokenmill.pipelines.evaluate import run_eval

    spec = ctx.recipe.eval
    assert spec is not None
    return run_eval(ctx, step, spec)


RUNNERS = {
    "ingest": _ingest,
    "classifier": _classifier,
    "curate": _curate,
    "tokenizer": _tokenizer,
    "encode": _encode,
    "blend": _blend,
    "train": run_training,
    "eval": _eval,
}


def summarise(step: Step, result: dict[str, Any]) -> str:
    counts = result.get("counts") if isinstance(result, dict) else None
    if step.kind == "encode":
        return f"{result.get('documents')} documents, {result.get('tokens')} tokens"
    if counts and "in" in counts:
        rejected = sum(counts.get("rejected", {}).values())
        return f"in {counts['in']}, kept {counts['kept']}, rejected {rejected}"
    if step.kind == "classifier":
        accuracy = result.get("holdout_accuracy")
        return f"held-out accuracy {accuracy:.3f}" if isinstance(accuracy, (int, float)) else "trained"
    if step.kind == "tokenizer":
        return f"vocab {result.get('vocab_size')}"
    if step.kind == "blend":
        return ", ".join(f"{k} {v:.3f}" for k, v in result.get("weights", {}).items())
    if step.kind == "train":
        loss = result.get("loss")
        return f"step {result.get('steps')}, loss {loss:.4f}" if isinstance(loss, (int, float)) else ""
    if step.kind == "eval":
        return f"{len(result.get('results', []))} result(s)"
    return ""
