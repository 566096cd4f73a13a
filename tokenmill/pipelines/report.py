"""`WORKDIR/report.html` (self-contained, charts inline as SVG) and `WORKDIR/report.md`.

Sections, in order (each has a stable id in the HTML, which the tests look for):
`summary` (steps, timings, fingerprints), `funnel` (documents and tokens through each stage
per source, with rejection reasons), `lengths` (document length histograms before and after
curation), `blend` (requested against realised weights), `training` (loss and validation
curves, throughput), `evaluation` (the results table). A section whose step has not run says
so instead of disappearing, so a partial run still has a readable report; one whose step the
recipe does not have says that.
"""

from __future__ import annotations

import base64
import json
import math
import statistics
import time
from html import escape
from pathlib import Path
from typing import Any

from tokenmill import __version__
from tokenmill.eval.results import RESULT_COLUMNS, result_cells
from tokenmill.infra.atomic import atomic_write_text, read_json
from tokenmill.pipelines.recipe import Recipe
from tokenmill.pipelines.step_graph import Step, read_state
from tokenmill.pipelines.svg import bar_chart, histogram, line_chart

SECTIONS = (
    ("summary", "Run summary"),
    ("funnel", "Data funnel"),
    ("lengths", "Document lengths"),
    ("blend", "Blend"),
    ("training", "Training"),
    ("evaluation", "Evaluation"),
)
# Documents whose lengths are read per stage for the histograms (a sample beyond this).
LENGTH_SAMPLE = 200_000


def _manifest(stage_dir: Path) -> dict[str, Any] | None:
    return read_json(stage_dir / "manifest.json")


def doc_lengths(stage_dir: Path, limit: int = LENGTH_SAMPLE) -> list[int]:
    """Character lengths of the kept documents of a stage (the first `limit`)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out: list[int] = []
    kept = stage_dir / "kept"
    if not kept.is_dir():
        return out
    for path in sorted(kept.rglob("*.parquet")):
        table = pq.read_table(path, columns=["text"])
        out.extend(x for x in pc.utf8_length(table["text"]).to_pylist() if x is not None)
        if len(out) >= limit:
            break
    return out[:limit]


def number_cell(v: Any) -> str | None:
    """A table number in the report's one format: counts with thousands separators (12,345, as
    the funnel's token counts), other values to 4 significant digits, large ones whole (12,346
    tokens/s, not 1.235e+04). None for a value that is not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int) or (math.isfinite(v) and abs(v) >= 1e4):
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _table_md(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        number = number_cell(v)
        if number is not None:
            return number
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _table_html(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        number = number_cell(v)
        return number if number is not None else escape(str(v))

    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Section:
    """One report section, written to both Markdown and HTML."""

    def __init__(self, key: str, title: str) -> None:
        self.key, self.title = key, title
        self.md: list[str] = []
        self.html: list[str] = []

    def text(self, text: str) -> None:
        self.md.append(text)
        self.html.append(f"<p>{escape(text)}</p>")

    def subtitle(self, text: str) -> None:
        self.md.append(f"### {text}")
        self.html.append(f"<h3>{escape(text)}</h3>")

    def table(self, header: list[str], rows: list[list[Any]]) -> None:
        self.md.append(_table_md(header, rows))
        self.html.append(_table_html(header, rows))

    def chart(self, svg: str, alt: str) -> None:
        if not svg:
            return
        data = base64.b64encode(svg.encode()).decode()
        self.md.append(f"![{alt}](data:image/svg+xml;base64,{data})")
        self.html.append(
            f'<figure class="chart" data-chart="{escape(alt)}">{svg}<figcaption>{escape(alt)}</figcaption></figure>'
        )


def _funnel(recipe: Recipe, steps: list[Step], section: Section) -> dict[str, list[tuple[str, Path]]]:
    stage_dirs: dict[str, list[tuple[str, Path]]] = {}
    for source in recipe.sources:
        chain = [s for s in steps if s.source == source.name and s.kind in ("ingest", "curate")]
        rows: list[list[Any]] = []
        reasons: list[list[Any]] = []
        stage_dirs[source.name] = []
        first_in = None
        for s in chain:
            manifest = _manifest(s.output)
            label = s.name.last if s.kind == "curate" else "ingest"
            if manifest is None:
                rows.append([label, "not run", "", "", ""])
                continue
            stage_dirs[source.name].append((label, s.output))
            counts = manifest["counts"]
            first_in = counts["in"] if first_in is None else first_in
            rejected = sum(counts["rejected"].values())
            rows.append(
                [
                    label,
                    counts["in"],
                    counts["kept"],
                    rejected,
                    f"{100 * counts['kept'] / first_in:.1f}%" if first_in else "",
                ]
            )
            for reason, n in sorted(counts["rejected"].items(), key=lambda kv: -kv[1]):
                reasons.append([label, reason, n, f"{100 * n / counts['in']:.1f}%" if counts["in"] else ""])
        encode = next((s for s in steps if s.kind == "encode" and s.source == source.name), None)
        meta_path = encode.output / f"{source.name}.json" if encode else None
        if meta_path and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            rows.append(
                [
                    "tokens",
                    meta["counts"]["in"],
                    meta["documents"],
                    sum(meta["counts"]["rejected"].values()),
                    f"{meta['tokens']:,} tokens",
                ]
            )
        section.subtitle(f"Source {source.name}")
        section.table(["stage", "documents in", "kept", "rejected", "kept of ingested"], rows)
        if reasons:
            section.table(["stage", "rejection reason", "documents", "share of stage input"], reasons)
        else:
            section.text("No document was rejected.")
    return stage_dirs


def _lengths(stage_dirs: dict[str, list[tuple[str, Path]]], section: Section) -> None:
    any_chart = False
    for source, dirs in stage_dirs.items():
        if not dirs:
            continue
        before = doc_lengths(dirs[0][1])
        after = doc_lengths(dirs[-1][1])
        series = {f"after {dirs[0][0]}": before}
        if len(dirs) > 1:
            series[f"after {dirs[-1][0]}"] = after
        section.subtitle(f"Source {source}")
        rows = []
        for name, values in series.items():
            if values:
                ordered = sorted(values)
                rows.append(
                    [name, len(values), ordered[len(ordered) // 2], round(sum(values) / len(values), 1), ordered[-1]]
                )
        section.table(["documents", "count", "median chars", "mean chars", "max chars"], rows)
        section.chart(
            histogram(f"{source}: document length (characters)", series, "characters (log scale)"),
            f"{source} document lengths",
        )
        any_chart = True
    if not any_chart:
        section.text("Curation has not run yet.")


def train_config(recipe: Recipe, workdir: Path) -> dict[str, Any] | None:
    """The training config in its nested sections (`parallel.dp`, `schedule.steps`, ...): the
    run's own `config.yaml`, written by the trainer with every key as trained; before training,
    the recipe's, with its layout and the trainer's defaults filled in. None without training."""
    import yaml

    trained = workdir / "train" / "run" / "config.yaml"
    if trained.is_file():
        data = yaml.safe_load(trained.read_text())
        if isinstance(data, dict) and isinstance(data.get("parallel"), dict):
            return data
    if recipe.train is None:
        return None
    from tokenmill.train.config import config_from_dict

    return config_from_dict(recipe.train_config_dict()).to_dict()


def _trained_samples(workdir: Path) -> tuple[int, int] | None:
    """(samples consumed, step) at the last step the run logged, or None before training."""
    from tokenmill.train.metrics import read_metrics

    logged = [m for m in read_metrics(workdir / "train" / "run") if isinstance(m.get("consumed_samples"), int)]
    return (int(logged[-1]["consumed_samples"]), int(logged[-1]["step"])) if logged else None


def _planned_samples(config: dict[str, Any]) -> int:
    """The samples the training schedule draws in all (a batch ramp-up included)."""
    from tokenmill.train.config import config_from_dict
    from tokenmill.train.optim import Schedule

    return Schedule(config_from_dict(config)).total_samples


def realised_blend(blend_file: Path, samples: int) -> list[int]:
    """How many of the first `samples` training samples each entry of the blend file gives:
    the trainer's own draw (`BlendedDataset`: the weights normalised twice, as Megatron's)."""
    import numpy as np

    from tokenmill.tokenize.blend import build_blending_indices, load_blend_file, normalize_weights

    entries = load_blend_file(blend_file)
    weights = normalize_weights(normalize_weights([e.weight for e in entries]))
    index, _ = build_blending_indices(weights, samples)
    return np.bincount(index, minlength=len(entries)).tolist()


def train_split_tokens(prefix: str | Path, split_ratios: str) -> int:
    """The tokens of a shard's train split (the documents the trainer samples from)."""
    from tokenmill.tokenize.gpt_dataset import split_document_range
    from tokenmill.tokenize.indexed import IndexedDataset

    data = IndexedDataset(prefix)
    try:
        bounds = split_document_range(len(data), split_ratios, "train")
        return 0 if bounds is None else int(data.sequence_lengths[bounds[0] : bounds[1]].sum(dtype="int64"))
    finally:
        data.close()


def _blend(recipe: Recipe, workdir: Path, steps: list[Step], section: Section) -> None:
    blend_step = next((s for s in steps if s.kind == "blend"), None)
    info_path = blend_step.output / "blend-info.json" if blend_step else None
    if not info_path or not info_path.exists():
        section.text("No blend has been built yet." if blend_step else "The recipe has no blend.")
        return
    assert blend_step is not None
    info = json.loads(info_path.read_text())
    # The recipe's order, which is the blend file's: the realised counts below come in it.
    names = [e["source"] for e in info["requested"]]
    weights = [info["weights"][n] for n in names]
    requested = {e["source"]: e for e in info["requested"]}
    config = train_config(recipe, workdir)
    trained = _trained_samples(workdir) if config else None
    samples = trained[0] if trained else (_planned_samples(config) if config else None)
    realised, epochs = weights, [None] * len(names)
    if samples:
        from tokenmill.tokenize.blend import load_blend_file

        # The blend file the trainer read; its entries are the recipe's sources, in its order.
        blend_file = blend_step.output / "blend.json"
        counts = realised_blend(blend_file, samples)
        realised = [c / samples for c in counts]
        seq_len = config["dataset"].get("seq_len") or config["model"]["max_seq_len"]
        split = config["dataset"]["split"]
        prefixes = [e.prefix for e in load_blend_file(blend_file)]
        epochs = [c * seq_len / max(train_split_tokens(p, split), 1) for c, p in zip(counts, prefixes)]
    rows = []
    for name, w, r, e in zip(names, weights, realised, epochs):
        req = requested[name]
        asked = f"weight {req['weight']}" if req.get("weight") is not None else f"{req['epochs']} epochs"
        rows.append([name, asked, info["tokens"][name], round(w, 4), round(r, 4), "" if e is None else round(e, 3)])
    if trained:
        realised_text = f"realised shares are those of the {samples:,} samples training drew (to step {trained[1]})"
    elif samples:
        realised_text = f"realised shares are those of the {samples:,} samples training will draw"
    else:
        realised_text = "the recipe does not train, so realised shares equal the requested ones"
    section.text(
        "Requested shares come from the recipe (epochs become weights proportional to epochs x tokens); "
        + realised_text
        + (
            "; epochs seen count those samples' tokens (seq_len each) over the tokens of each source's train split."
            if samples
            else "."
        )
    )
    section.table(["source", "requested", "tokens", "requested share", "realised share", "epochs seen"], rows)
    section.chart(
        bar_chart("Blend: requested vs realised share", names, {"requested": weights, "realised": realised}, "share"),
        "blend requested vs realised",
    )


def _training(recipe: Recipe, workdir: Path, section: Section) -> None:
    from tokenmill.train.metrics import read_metrics

    run_dir = workdir / "train" / "run"
    metrics = read_metrics(run_dir)
    if not metrics:
        section.text("Training has not run yet.")
        return
    loss = [(m["step"], m["loss"]) for m in metrics if isinstance(m.get("loss"), (int, float)) and "step" in m]
    val = [(m["step"], m["val_loss"]) for m in metrics if isinstance(m.get("val_loss"), (int, float))]
    tps = [(m["step"], m["tokens_per_s"]) for m in metrics if isinstance(m.get("tokens_per_s"), (int, float))]
    last = metrics[-1]
    rows = [["steps", last.get("step")], ["final training loss", last.get("loss")]]
    if val:
        rows.append(["final validation loss", val[-1][1]])
        rows.append(["validation perplexity", math.exp(min(val[-1][1], 50))])
    if tps:
        rows.append(["median tokens/s", statistics.median([v for _, v in tps])])
    mfu = [m["mfu"] for m in metrics if isinstance(m.get("mfu"), (int, float))]
    if mfu:
        rows.append(["median MFU", statistics.median(mfu)])
    config = train_config(recipe, workdir)
    if config:
        p = config["parallel"]
        cp = f" cp={p['cp']}" if p.get("cp", 1) > 1 else ""  # configs saved before cp have none
        rows.append(["layout", f"tp={p['tp']} pp={p['pp']} dp={p['dp']}{cp} zero={p['zero']}"])
    section.table(["quantity", "value"], rows)
    series = {"train loss": loss}
    if val:
        series["validation loss"] = val
    section.chart(line_chart("Loss", series, "step", "loss"), "loss curves")
    if tps:
        section.chart(line_chart("Throughput", {"tokens/s": tps}, "step", "tokens per second"), "throughput")
    _evaluation_during_training(metrics, section)


def evaluation_curves(
    metrics: list[dict[str, Any]],
) -> tuple[dict[str, list[tuple[float, float]]], list[tuple[float, float]]]:
    """The in-training evaluation's curves from metrics rows: the suite's aggregate and each
    task's centered accuracy by name, and bits per byte."""
    scores: dict[str, list[tuple[float, float]]] = {}
    bpb: list[tuple[float, float]] = []
    for row in metrics:
        for key, value in row.items():
            if not key.startswith("eval/") or not isinstance(value, (int, float)):
                continue
            name = key.removeprefix("eval/")
            if name == "bpb":
                bpb.append((row["step"], value))
            elif name.endswith("/centered_acc"):
                scores.setdefault(name.removesuffix("/centered_acc"), []).append((row["step"], value))
            elif "/" not in name and name != "seconds":  # the suite's aggregate
                scores.setdefault(name.upper(), []).append((row["step"], value))
    return scores, bpb


def _evaluation_during_training(metrics: list[dict[str, Any]], section: Section) -> None:
    scores, bpb = evaluation_curves(metrics)
    if scores:
        chart = line_chart("Evaluation during training", scores, "step", "centered accuracy")
        section.chart(chart, "in-training evaluation: the suite's aggregate and each task's centered accuracy")
    if bpb:
        section.chart(
            line_chart("Held-out bits per byte", {"bits per byte": bpb}, "step", "bits per byte"), "bits per byte"
        )


def _evaluation(workdir: Path, section: Section) -> None:
    path = workdir / "eval" / "results.json"
    if not path.exists():
        section.text("Evaluation has not run yet.")
        return
    data = json.loads(path.read_text())
    if data.get("results"):
        section.table(RESULT_COLUMNS, result_cells(data["results"]))
    else:
        section.text("No result.")
    for item in data.get("skipped", []):
        section.text(f"skipped {item['task']}: {item['reason']}")


def _summary(recipe: Recipe, workdir: Path, steps: list[Step], section: Section) -> None:
    rows = []
    for s in steps:
        state = read_state(workdir, s)
        if state and state.get("fingerprint") == s.fingerprint:
            status, seconds, summary = "done", state.get("seconds"), state.get("summary", "")
        elif state:
            status, seconds, summary = "out of date", state.get("seconds"), state.get("summary", "")
        else:
            status, seconds, summary = "not run", "", ""
        rows.append([s.name, status, seconds if seconds != "" else "", summary, s.fingerprint])
    section.text(
        f"Recipe {recipe.name}"
        + (f": {recipe.description}" if recipe.description else "")
        + f". tokenmill {__version__}; report written {time.strftime('%Y-%m-%d %H:%M:%S')}."
    )
    section.table(["step", "status", "seconds", "result", "fingerprint"], rows)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}figure{margin:.8em 0}figcaption{font-size:.85em;color:#666}nav a{margin-right:1em}
"""


def write_report(recipe: Recipe, workdir: Path, steps: list[Step]) -> tuple[Path, Path]:
    sections = {key: Section(key, title) for key, title in SECTIONS}
    _summary(recipe, workdir, steps, sections["summary"])
    stage_dirs = _funnel(recipe, steps, sections["funnel"])
    _lengths(stage_dirs, sections["lengths"])
    _blend(recipe, workdir, steps, sections["blend"])
    # A recipe without a train or eval step says so: "has not run yet" would promise a step.
    kinds = {s.kind for s in steps}
    if "train" in kinds:
        _training(recipe, workdir, sections["training"])
    else:
        sections["training"].text("The recipe has no training step.")
    if "eval" in kinds:
        _evaluation(workdir, sections["evaluation"])
    else:
        sections["evaluation"].text("The recipe has no evaluation step.")

    return write_page(f"tokenmill report: {recipe.name}", list(sections.values()), workdir / "report")


def write_page(title: str, sections: list[Section], stem: Path) -> tuple[Path, Path]:
    """The sections as Markdown (`stem` + .md) and as a self-contained page (`stem` + .html)."""
    md = [f"# {title}", ""]
    for s in sections:
        md += [f"## {s.title}", "", *[block + "\n" for block in s.md]]
    nav = "".join(f'<a href="#{s.key}">{escape(s.title)}</a>' for s in sections)
    body = "".join(f'<section id="{s.key}"><h2>{escape(s.title)}</h2>{"".join(s.html)}</section>' for s in sections)
    html = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1><nav>{nav}</nav>{body}</body></html>\n"
    )
    md_path, html_path = stem.with_suffix(".md"), stem.with_suffix(".html")
    for path, content in ((md_path, "\n".join(md)), (html_path, html)):
        atomic_write_text(path, content)
    return md_path, html_path
