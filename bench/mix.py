"""`tokenmill mix` finds a known answer.

Four sources of distinct kinds of real text: Wikipedia articles (WikiText-2's valid split),
Shakespeare (tinyshakespeare), Python docstrings (the standard library's, through the
`python-docs` source) and how-to instructions (PIQA's goals and solutions). The held-out target
is a blend of other text of the same kinds: 60% Wikipedia (WikiText-2's test split), 30%
Shakespeare (the play text after the sources' part), 10% docstrings (ones the source does not
hold) and 0% instructions, by bytes. `tokenmill mix` should find weights near that blend, and
its choice, trained again at fresh seeds, should predict the target better than the uniform
blend, the token-proportional blend and the best proxy's blend, retrained at the same seeds.

    python bench/mix.py [--mixtures 24] [--steps 300] [--chars 300000] [--workdir DIR]

Prints the rank correlation, the chosen blend beside the true one with their L1 distance, the
check runs' bits per byte (mean and spread over the check seeds, and the verdicts) and the
compute spent. tests/pipelines/test_mix.py runs a smaller
version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRUE_BLEND = {"wiki": 0.6, "shakespeare": 0.3, "pydocs": 0.1, "howto": 0.0}


def _shared_data() -> Path:
    return Path(os.environ.get("TOKENMILL_SHARED_DATA") or REPO.parent / "shared" / "data")


def _wiki_articles(path: Path) -> list[str]:
    import re

    text = path.read_text(encoding="utf-8")
    return [a.strip() for a in re.split(r"\n(?= = [^=])", text) if len(a.strip()) > 200]


def _paragraphs(text: str, size: int) -> list[str]:
    """Shakespeare as documents of about `size` characters, cut at blank lines."""
    docs, current = [], ""
    for block in text.split("\n\n"):
        current += block + "\n\n"
        if len(current) >= size:
            docs.append(current.strip())
            current = ""
    return docs


def _take(docs: list[str], chars: int) -> list[str]:
    out, total = [], 0
    for d in docs:
        if total >= chars:
            break
        out.append(d)
        total += len(d)
    return out


def build_known_blend(
    directory: Path,
    chars: int = 300_000,
    target_chars: int = 60_000,
    batch_size: int = 8,
    seq_len: int = 64,
    check_seeds: int | None = None,
) -> dict[str, Path]:
    """Write the four sources (JSONL, about `chars` characters each), the target (JSONL) and a
    recipe mixing the sources under `directory` (its check runs at `check_seeds` seeds, default
    the recipe default); returns their paths ("recipe", "target")."""
    from tokenmill.curate.python_docs import iter_documents

    data = _shared_data() / "corpus"
    directory.mkdir(parents=True, exist_ok=True)
    shakespeare = _paragraphs((data / "tinyshakespeare.txt").read_text(encoding="utf-8"), 2000)
    docstrings = [d["text"] for d in iter_documents() if d["source"] == "python-docs/stdlib"]
    random.Random(0).shuffle(docstrings)
    piqa = [json.loads(line) for line in (_shared_data() / "eval" / "piqa_valid.jsonl").open()]
    howto = [f"{r['goal']}\n{r['sol1']}\n{r['sol2']}" for r in piqa]
    # Held-out parts: the target never holds a document the sources hold.
    sources = {
        "wiki": _take(_wiki_articles(data / "wikitext2_valid.txt"), chars),
        "shakespeare": _take(shakespeare[: len(shakespeare) * 2 // 3], chars),
        "pydocs": _take(docstrings[: len(docstrings) // 2], chars),
        "howto": _take(howto, chars),
    }
    held_out = {
        "wiki": _wiki_articles(data / "wikitext2_test.txt"),
        "shakespeare": shakespeare[len(shakespeare) * 2 // 3 :],
        "pydocs": docstrings[len(docstrings) // 2 :],
    }
    paths: dict[str, Path] = {}
    for name, docs in sources.items():
        paths[name] = directory / f"{name}.jsonl"
        _write_jsonl(paths[name], docs)
    target = [
        d for name, share in TRUE_BLEND.items() if share > 0 for d in _take(held_out[name], int(target_chars * share))
    ]
    paths["target"] = directory / "target.jsonl"
    _write_jsonl(paths["target"], target)
    paths["recipe"] = directory / "sources.yaml"
    _write_if_changed(
        paths["recipe"],
        "name: known-blend\n"
        "sources:\n"
        + "".join(f"  - {{name: {name}, path: {name}.jsonl, format: jsonl}}\n" for name in sources)
        + "tokenize: {vocab_size: 1024}\n"
        "proxies:\n"
        "  config: tiny\n"
        f"  batch_size: {batch_size}\n"
        f"  seq_len: {seq_len}\n"
        + (f"  check_seeds: {check_seeds}\n" if check_seeds else "")
        + "  target: target.jsonl\n",
    )
    return paths


def _write_jsonl(path: Path, docs: list[str]) -> None:
    _write_if_changed(
        path, "".join(json.dumps({"id": f"{path.stem}-{i}", "text": t}) + "\n" for i, t in enumerate(docs))
    )


def _write_if_changed(path: Path, text: str) -> None:
    """Files rewritten unchanged would change their identity (mtime) and so every fingerprint
    after them: a rerun in the same work directory reuses its shards and proxies."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def l1_distance(chosen: dict[str, float], true: dict[str, float] = TRUE_BLEND) -> float:
    return sum(abs(chosen.get(s, 0.0) - w) for s, w in true.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mixtures", type=int, default=24)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--chars", type=int, default=300_000, help="characters per source")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--workdir", default="mix-bench")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tokenmill.pipelines.mix import run_mix
    from tokenmill.pipelines.recipe import load_recipe

    workdir = Path(args.workdir).resolve()
    paths = build_known_blend(workdir / "corpus", args.chars, batch_size=args.batch_size, seq_len=args.seq_len)
    started = time.time()
    load = os.getloadavg()
    result = run_mix(
        load_recipe(paths["recipe"]),
        paths["recipe"],
        workdir,
        mixtures=args.mixtures,
        steps=args.steps,
        workers=args.workers,
        progress=False,
    )
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print(
        f"proxies: {args.mixtures} mixtures x {args.steps} steps x {args.batch_size} x {args.seq_len} tokens of the"
        f" tiny model, {args.chars:,} characters per source"
    )
    tried = ", ".join(f"{model} {rho:.3f}" for model, rho in result.correlations.items())
    print(f"rank correlation (leave-one-out): {result.rank_correlation:.3f} ({result.model} regression; {tried})")
    print("true blend:   " + ", ".join(f"{s}={w:.2f}" for s, w in TRUE_BLEND.items()))
    print("chosen blend: " + ", ".join(f"{s}={result.chosen[s]:.2f}" for s in TRUE_BLEND))
    print(f"L1 distance chosen - true: {l1_distance(result.chosen):.3f}")
    best = result.best_proxy
    print(f"target bits/byte, best proxy as recorded ({best['name']}, proxies' seed): {best['target_bpb']:.4f}")
    for score in result.checks:
        per_seed = ", ".join(f"{s:.4f}" for s in score.scores)
        print(f"target bits/byte, {score.name}: {score.mean:.4f} (sd {score.sd:.4f}; seeds {per_seed})")
    for verdict in result.verdicts:
        print(verdict.verdict)
    c = result.compute
    print(
        f"compute: {c['proxies']:.0f} proxies, {c['tokens']:,.0f} tokens, {c['proxy_seconds']:.0f} proxy-seconds,"
        f" {time.time() - started:.0f}s wall"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
