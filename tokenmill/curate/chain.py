"""Several per-document stages in one pass: `tokenmill curate chain` and a recipe's fused steps.

A per-document stage (a `StageOptions` whose work is `process` on each batch of its input's
Parquet partitions: extract, normalize, langid, url-filter, pii, filter, classify) needs nothing
but the documents the stage before it kept. A chain of them runs as one task per partition of
the first stage's input: each batch goes through every stage in memory (`stage.run_chain`), so
the text is read once and written once, by the last stage, where stage by stage it was written
once per stage. The first stage may be any stage that splits its own input (ingest's raw files).

Every stage still has its stage directory, with its `manifest.json` (`in == kept + rejected`, the
stage before it as upstream, `chain` saying what was written) and its `rejected/`; only the last
stage writes `kept/` unless `keep_intermediate`. Rejected documents are written as ids by default
(`REJECTED_DEFAULT`): at web scale most of a crawl is rejected (Common Crawl's HTML pages, most of
which no filter keeps, are several times the kept text), so writing them whole would write the
crawl again; an id and a reason still say which stage dropped which document and why.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tokenmill.curate.registry import (
    Stage,
    add_stage_arguments,
    all_stages,
    for_workers,
    print_summary,
    runner_options,
    stage_input,
)
from tokenmill.curate.stage import REJECTED_MODES, STAGE_OUTPUT, Link, StageOptions, run_chain
from tokenmill.errors import ConfigError
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import input_list
from tokenmill.infra.outputs import claim_output

REJECTED_DEFAULT = "ids"


def per_document(stage: Stage) -> bool:
    """Whether a stage works document batch by batch on its input's Parquet partitions, and so
    can follow another stage in one pass."""
    return (
        stage.run is None
        and stage.io == "documents"
        and issubclass(stage.options, StageOptions)
        and stage.options.partitions is StageOptions.partitions
    )


def can_lead(stage: Stage) -> bool:
    """Whether a stage can start a chain: any stage run by its partition tasks (ingest too)."""
    return stage.run is None and stage.io != "none" and issubclass(stage.options, StageOptions)


def check_chain(stages: Sequence[Stage]) -> None:
    """One line for a stage that cannot take its place in a chain."""
    if not can_lead(stages[0]):
        raise ConfigError(f"stage `{stages[0].name}` cannot run in a chain: it has phases of its own")
    for stage in stages[1:]:
        if not per_document(stage):
            raise ConfigError(
                f"stage `{stage.name}` cannot follow another in a chain: it does not work document by document"
            )


def run_stages(
    stages: Sequence[tuple[Stage, StageOptions]],
    input: Any,
    outputs: Sequence[str | Path],
    *,
    replay: int = 0,
    rejected: str = REJECTED_DEFAULT,
    keep_intermediate: bool = False,
    client: Any = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run `stages` over `input` in one pass, stage i writing `outputs[i]`; the first `replay`
    stages run only to feed the rest (their directories are up to date). Returns the manifests
    of the stages written."""
    check_chain([stage for stage, _ in stages])
    first = stages[0][1]
    inputs = input_list(input)
    links = [
        Link(
            options.name,
            options.manifest_config(),
            output,
            process=options.process if position else None,
            inputs=[storage.absolute(p) for p in inputs] if position == 0 else [],
            upstream=options.upstream(input) if position == 0 else None,
            versions=options.versions(),
            finalize=options.finalize,
            write=position >= replay,
            keep=keep_intermediate or position == len(stages) - 1,
        )
        for position, ((_, options), output) in enumerate(zip(stages, outputs))
    ]
    with ExitStack() as claims:
        for link in links:
            if link.write:
                flag = "--output" if link is links[-1] else f"--output ({link.name})"
                claims.enter_context(claim_output(link.output, STAGE_OUTPUT, flag=flag, inputs=inputs))
        return run_chain(
            links,
            first.partitions(input),
            rejected=rejected,
            client=client,
            scheduler=scheduler,
            workers=workers,
            progress=progress,
        )


def stage_options(stage: Stage, values: dict[str, Any]) -> StageOptions:
    """A stage's options from `NAME: value` pairs as a recipe gives them, with the path options
    made absolute for the Dask workers (`for_workers`)."""
    for f in stage.recipe_fields():
        kind, value = f.metadata["option"]["path"], values.get(f.name)
        if kind and isinstance(value, list):
            values[f.name] = [for_workers(v, kind) for v in value]
        elif kind and value is not None:
            values[f.name] = for_workers(value, kind)
    try:
        return stage.recipe_options(values)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in getattr(error, "errors", lambda: [])()
        )
        raise ConfigError(f"curate chain: options of `{stage.name}`: {problems or error}") from None


# --------------------------------------------------------------------------------------------
# `tokenmill curate chain`


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chain",
        help="run several curate stages in one pass (each partition read once, the text written once)",
        description="Run STAGES in one pass over the input: each partition goes through every stage in memory."
        " OUTPUT gets one stage directory per stage (OUTPUT/01-extract, OUTPUT/02-filter, ...), each with its"
        " manifest.json and rejected/; only the last one has kept/ unless --keep-intermediate. The first stage may"
        " be ingest (then --input takes raw files); the others work document by document (extract, normalize,"
        " langid, url-filter, pii, filter, classify).",
    )
    parser.add_argument(
        "--stages", required=True, help="the stages, in order, separated by commas: e.g. extract,langid,filter"
    )
    parser.add_argument(
        "--option",
        dest="stage_options",
        action="append",
        default=[],
        metavar="STAGE.NAME=VALUE",
        help="an option of one stage, as a recipe writes it (VALUE read as YAML): extract.extractor=trafilatura,"
        " 'langid.languages=[en, fr]', 'filter.disable=[c4]'; repeat for more",
    )
    parser.add_argument(
        "--rejected",
        choices=REJECTED_MODES,
        default=REJECTED_DEFAULT,
        help="what rejected/ holds: whole documents, their id and reason (ids), or nothing beyond the manifest's"
        f" counts (none) (default {REJECTED_DEFAULT})",
    )
    parser.add_argument(
        "--keep-intermediate", action="store_true", help="every stage writes its kept/, not only the last"
    )
    add_stage_arguments(
        parser,
        input_help="a stage directory (its kept/ is read) or Parquet files / directories; raw files when the first"
        " stage is ingest",
        output_help="the directory of the stages' directories (OUTPUT/01-STAGE, OUTPUT/02-STAGE, ...)",
    )
    parser.set_defaults(func=_command)


def parse_stages(names: str, settings: Sequence[str]) -> list[tuple[Stage, StageOptions]]:
    """`--stages` and `--option` as stages with their options (one line for any mistake)."""
    import yaml

    stages = all_stages()
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in stages]
    if unknown or not chosen:
        raise ConfigError(
            f"--stages: unknown stage {', '.join(unknown) or '(none given)'}; stages: {', '.join(stages)}"
        )
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"--stages names a stage twice: {names}")
    check_chain([stages[name] for name in chosen])
    values: dict[str, dict[str, Any]] = {name: {} for name in chosen}
    for setting in settings:
        key, sep, value = setting.partition("=")
        stage_name, dot, option_name = key.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"--option takes STAGE.NAME=VALUE (e.g. extract.extractor=trafilatura), got {setting!r}")
        if stage_name not in values:
            raise ConfigError(f"--option {setting}: `{stage_name}` is not one of --stages {names}")
        try:
            values[stage_name][option_name] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise ConfigError(f"--option {setting}: the value is not YAML: {error}") from None
    return [(stages[name], stage_options(stages[name], values[name])) for name in chosen]


def stage_dirs(output: str | Path, names: Sequence[str]) -> list[str]:
    """OUTPUT/01-NAME, OUTPUT/02-NAME, ...: each stage's directory in a chain's output."""
    return [storage.join(output, f"{position:02d}-{name}") for position, name in enumerate(names, start=1)]


def _command(args: argparse.Namespace) -> int:
    stages = parse_stages(args.stages, args.stage_options)
    outputs = stage_dirs(args.output, [stage.name for stage, _ in stages])
    input = stage_input(args) if stages[0][0].io == "documents" else args.input
    manifests = run_stages(
        stages,
        input,
        outputs,
        rejected=args.rejected,
        keep_intermediate=args.keep_intermediate,
        **runner_options(args),
    )
    for manifest, output in zip(manifests, outputs):
        print_summary(manifest, output)
    return 0
