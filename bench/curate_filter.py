"""Bench: normalize + filter throughput per core against datatrove, and keep/reject agreement.

    .venv/bin/python bench/curate_filter.py [--repeat 3] [--out bench/results/curate_filter.txt]

Documents: the real corpora in ../shared/data/corpus -- WikiText-2 (valid + test) split into
articles at ` = Title = ` lines, and Shakespeare split into scenes of 30 speeches. Both sides
see the same normalized text (tokenmill's NormalizeStage: ftfy + NFC + whitespace clean-up).

tokenmill runs here, in one process (= one core). datatrove runs in its own virtual environment
(`.venv-bench`, with `pip install datatrove spacy regex pandas`), in a subprocess started by this
script with `--datatrove-worker` (also one process): its GopherRepetitionFilter,
GopherQualityFilter, C4QualityFilter and FineWebQualityFilter with default thresholds, in the
same order as ours (FineWeb's order; C4 edits the text the next filter sees). Both are timed on
the filter calls alone, over the same documents, the median of `--repeat` passes (with their
spread), in CPU seconds of
the process (`time.process_time`): documents per CPU second is documents per second per core,
and it does not swing with the load of other processes on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from measure import check_load, cpu_timed, emit_report

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TOKENMILL_SHARED_DATA", ROOT.parent / "shared" / "data"))
BENCH_PYTHON = Path(os.environ.get("TOKENMILL_BENCH_PYTHON", ROOT / ".venv-bench" / "bin" / "python"))

# datatrove reason -> our rule name (same rule, different spelling)
DATATROVE_REASONS = {
    "gopher_short_doc": "gopher_quality.min_words",
    "gopher_long_doc": "gopher_quality.max_words",
    "gopher_below_avg_threshold": "gopher_quality.mean_word_length",
    "gopher_above_avg_threshold": "gopher_quality.mean_word_length",
    "gopher_too_many_hashes": "gopher_quality.hash_ratio",
    "gopher_too_many_ellipsis": "gopher_quality.ellipsis_ratio",
    "gopher_too_many_bullets": "gopher_quality.bullet_lines",
    "gopher_too_many_end_ellipsis": "gopher_quality.ellipsis_lines",
    "gopher_below_alpha_threshold": "gopher_quality.alpha_words",
    "gopher_enough_stop_words": "gopher_quality.stop_words",
    "empty": "empty",
    "dup_para_frac": "gopher_repetition.dup_para_frac",
    "dup_para_char_frac": "gopher_repetition.dup_para_char_frac",
    "dup_line_frac": "gopher_repetition.dup_line_frac",
    "dup_line_char_frac": "gopher_repetition.dup_line_char_frac",
    **{f"top_{n}_gram": f"gopher_repetition.top_{n}_gram" for n in (2, 3, 4)},
    **{f"duplicated_{n}_n_grams": f"gopher_repetition.dup_{n}_gram" for n in range(5, 11)},
    "lorem_ipsum": "c4.lorem_ipsum",
    "curly_bracket": "c4.curly_bracket",
    "too_few_sentences": "c4.min_sentences",
    "line_punct_ratio": "fineweb.line_punct_ratio",
    "short_line_ratio": "fineweb.short_line_ratio",
    "char_dup_ratio": "fineweb.char_dup_ratio",
    "list_ratio": "fineweb.list_ratio",
}
FAMILY_ORDER = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def detokenize_wikitext(text: str) -> str:
    """WikiText-2 is stored tokenized (` , `, ` @-@ `, `<unk>`); put it back into running text."""
    text = text.replace("<unk>", "unk")
    text = re.sub(r" @([-.,])@ ", r"\1", text)
    text = re.sub(r" ([.,;:!?)\]'])", r"\1", text)
    text = re.sub(r"([(\[]) ", r"\1", text)
    return re.sub(r" (n't|'s|'re|'ve|'ll|'d|'m)\b", r"\1", text)


DOCUMENT_SETS = ("wikitext", "wikitext_detok", "scene", "speech")


def corpus_documents(shared: Path = SHARED, sets=DOCUMENT_SETS) -> list[tuple[str, str]]:
    """(id, text): WikiText-2 articles as stored (`wikitext`) and detokenized (`wikitext_detok`),
    Shakespeare in scenes of 30 speeches (`scene`) and one speech per document (`speech`)."""
    docs = []
    for split in ("valid", "test"):
        raw = (shared / "corpus" / f"wikitext2_{split}.txt").read_text(encoding="utf-8")
        articles = [a for a in re.split(r"(?m)^(?= = [^=].* = \s*$)", raw) if a.strip()]
        if "wikitext" in sets:
            docs += [(f"wikitext-{split}-{i}", a) for i, a in enumerate(articles)]
        if "wikitext_detok" in sets:
            docs += [(f"wikitext_detok-{split}-{i}", detokenize_wikitext(a)) for i, a in enumerate(articles)]
    speeches = (shared / "corpus" / "tinyshakespeare.txt").read_text(encoding="utf-8").split("\n\n")
    if "scene" in sets:
        docs += [(f"scene-{i // 30}", "\n\n".join(speeches[i : i + 30])) for i in range(0, len(speeches), 30)]
    if "speech" in sets:
        docs += [(f"speech-{i}", speech) for i, speech in enumerate(speeches) if speech.strip()]
    return docs


# ----------------------------------------------------------------------------- datatrove side


def datatrove_worker(in_path: str, out_path: str, repeat: int) -> None:
    """Runs inside .venv-bench: datatrove's four filters over the documents in `in_path`."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    docs = json.loads(Path(in_path).read_text())
    filters = {
        "gopher_repetition": GopherRepetitionFilter(),
        "gopher_quality": GopherQualityFilter(),
        "c4": C4QualityFilter(),
        "fineweb": FineWebQualityFilter(),
    }

    def verdict(result) -> str | None:
        if result is True:
            return None
        return result[1] if isinstance(result, tuple) else "rejected"

    # warm-up (loads spaCy) outside the timing
    filters["gopher_quality"].filter(Document(text=docs[0]["text"], id="warm"))

    def run() -> list[dict]:
        results = []
        for d in docs:
            doc = Document(text=d["text"], id=d["id"])
            reason = None
            for name in FAMILY_ORDER:
                reason = verdict(filters[name].filter(doc))
                if reason is not None:
                    reason = f"{name}:{reason}"
                    break
            results.append({"id": d["id"], "reason": reason, "text": doc.text if reason is None else None})
        return results

    timing, results = cpu_timed(repeat, run)
    # each family alone on the normalized text
    alone = {}
    for name in FAMILY_ORDER:
        alone[name] = [verdict(filters[name].filter(Document(text=d["text"], id=d["id"]))) for d in docs]
    from importlib.metadata import version

    Path(out_path).write_text(
        json.dumps(
            {
                "seconds": timing.median,
                "spread": timing.spread,
                "results": results,
                "alone": alone,
                "version": version("datatrove"),
            }
        )
    )


# ----------------------------------------------------------------------------- our side


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None, help="also write the report here")
    parser.add_argument("--examples", type=int, default=3, help="disagreements shown per pair of reasons")
    parser.add_argument("--sets", nargs="+", default=list(DOCUMENT_SETS), choices=DOCUMENT_SETS, help="document sets")
    parser.add_argument("--datatrove-worker", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.datatrove_worker:
        datatrove_worker(*args.datatrove_worker, args.repeat)
        return 0
    machine_load = check_load()

    import pandas as pd

    from tokenmill.curate.filter import FilterStage
    from tokenmill.curate.rules import RuleSet

    docs = corpus_documents(sets=args.sets)
    frame = pd.DataFrame({"id": [d[0] for d in docs], "text": [d[1] for d in docs], "source": "bench"})
    try:
        from tokenmill.curate.normalize import NormalizeStage

        normalize = NormalizeStage()
        normalize_note = "tokenmill.curate.normalize.NormalizeStage (ftfy + NFC + whitespace)"
    except ImportError:  # pragma: no cover - before the normalize stage existed
        normalize = None
        normalize_note = "ftfy.fix_text + NFC (tokenmill.curate.normalize not present)"

    def run_normalize(df):
        if normalize is not None:
            out = normalize.process(df)
            return out.kept
        import unicodedata

        import ftfy

        return df.assign(text=[unicodedata.normalize("NFC", ftfy.fix_text(t)) for t in df["text"]])

    normalize.process(frame.head(2)) if normalize is not None else None  # warm-up (imports)
    norm_timing, normalized = cpu_timed(args.repeat, lambda: run_normalize(frame))
    stage = FilterStage()
    filter_timing, output = cpu_timed(args.repeat, lambda: stage.process(normalized))
    t_norm, t_filter = norm_timing.median, filter_timing.median
    ours = {row.id: None for row in output.kept.itertuples()}
    ours.update({row.id: row.reason for row in output.rejected.itertuples()})
    our_text = dict(zip(output.kept["id"], output.kept["text"]))

    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = Path(tmp) / "docs.json", Path(tmp) / "datatrove.json"
        in_path.write_text(json.dumps([{"id": i, "text": t} for i, t in zip(normalized["id"], normalized["text"])]))
        if not BENCH_PYTHON.exists():
            print(f"datatrove environment not found at {BENCH_PYTHON}; see this script's docstring", file=sys.stderr)
            return 1
        subprocess.run(
            [
                str(BENCH_PYTHON),
                str(Path(__file__).resolve()),
                "--datatrove-worker",
                str(in_path),
                str(out_path),
                "--repeat",
                str(args.repeat),
            ],
            check=True,
        )
        theirs_run = json.loads(out_path.read_text())

    def map_reason(reason):
        if reason is None:
            return None
        family, _, name = reason.partition(":")
        mapped = DATATROVE_REASONS.get(name, name)
        return mapped if "." in mapped else f"{family}.{mapped}"

    theirs = {r["id"]: map_reason(r["reason"]) for r in theirs_run["results"]}
    their_text = {r["id"]: r["text"] for r in theirs_run["results"] if r["text"] is not None}
    ids = list(normalized["id"])
    n = len(ids)

    keep_agree = sum((ours[i] is None) == (theirs[i] is None) for i in ids)
    reason_agree = sum(ours[i] == theirs[i] for i in ids)
    both_kept = [i for i in ids if ours[i] is None and theirs[i] is None]
    text_agree = sum(our_text[i] == their_text[i] for i in both_kept)

    # each family alone
    rules = RuleSet()
    from tokenmill.curate.rules import Doc

    alone_lines = []
    for name in FAMILY_ORDER:
        family = getattr(rules, name)
        mine = [family.apply(Doc(t), Counter())[1] for t in normalized["text"]]
        dt = [map_reason(f"{name}:{r}") if r else None for r in theirs_run["alone"][name]]
        agree = sum((a is None) == (b is None) for a, b in zip(mine, dt))
        alone_lines.append(
            f"  {name:<18} keep/reject agree {agree}/{n} ({agree / n:.1%}); kept: ours {mine.count(None)}, datatrove {dt.count(None)}"
        )

    cores = 1
    rate_norm = n / t_norm
    rate_filter = n / t_filter
    rate_both = n / (t_norm + t_filter)
    rate_dt = n / theirs_run["seconds"]
    kept_ours = sum(ours[i] is None for i in ids)
    kept_dt = sum(theirs[i] is None for i in ids)
    lines = [
        "bench/curate_filter.py: normalize + heuristic filters, one process (one core) each",
        f"documents: {n} ({', '.join(f'{name} {sum(i.split(chr(45))[0] == name for i in ids)}' for name in args.sets)}), "
        f"{sum(map(len, normalized['text'])) / 1e6:.2f} M characters after normalize",
        "  wikitext: WikiText-2 articles as stored (tokenized); wikitext_detok: the same, detokenized;",
        "  scene: Shakespeare, 30 speeches per document; speech: one speech per document",
        f"normalize: {normalize_note}",
        f"datatrove {theirs_run['version']} (spaCy English word tokenizer), filters called directly, the median of {args.repeat} passes",
        "rates are documents per CPU second of one process (time.process_time), i.e. per core",
        machine_load,
        "",
        f"tokenmill normalize            {rate_norm / cores:10.1f} docs/s/core  (spread {norm_timing.spread:.0%})",
        f"tokenmill filter               {rate_filter / cores:10.1f} docs/s/core  (spread {filter_timing.spread:.0%})",
        f"tokenmill normalize + filter   {rate_both / cores:10.1f} docs/s/core",
        f"datatrove filters              {rate_dt / cores:10.1f} docs/s/core  (spread {theirs_run['spread']:.0%})",
        f"ratio filter / datatrove       {rate_filter / rate_dt:10.1f}x",
        f"ratio normalize+filter / datatrove filters {rate_both / rate_dt:6.1f}x",
        "",
        f"kept: tokenmill {kept_ours}/{n}, datatrove {kept_dt}/{n}",
        f"keep/reject agree on {keep_agree}/{n} documents ({keep_agree / n:.1%}); same reason on {reason_agree}/{n} ({reason_agree / n:.1%})",
        f"kept by both with identical C4-edited text: {text_agree}/{len(both_kept)}",
        "by document set (keep/reject agree; kept by tokenmill / datatrove):",
        *[
            f"  {name:<18} {sum((ours[i] is None) == (theirs[i] is None) for i in group)}/{len(group)}; "
            f"{sum(ours[i] is None for i in group)} / {sum(theirs[i] is None for i in group)}"
            for name in args.sets
            for group in [[i for i in ids if i.split("-")[0] == name]]
        ],
        "each family alone on the normalized text:",
        *alone_lines,
    ]
    pairs = Counter((ours[i], theirs[i]) for i in ids if ours[i] != theirs[i])
    if pairs:
        lines.append("disagreements (tokenmill reason | datatrove reason: documents):")
        for (a, b), count in pairs.most_common():
            examples = [i for i in ids if (ours[i], theirs[i]) == (a, b)][: args.examples]
            lines.append(f"  {a or 'kept'} | {b or 'kept'}: {count}  e.g. {', '.join(examples)}")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
