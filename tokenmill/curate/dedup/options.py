"""The options of the dedup stage (`tokenmill curate dedup`, `stage: dedup` in a recipe).

This module loads neither numba nor pandas: the command line builds its parser from these
declarations, and the compiled kernels load when a run needs them (`hasher`, `lsh`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tokenmill.curate.dedup.shingles import ShingleConfig, TextNormalization, parse_normalization
from tokenmill.curate.registry import option
from tokenmill.errors import ConfigError

if TYPE_CHECKING:
    from tokenmill.curate.dedup.lsh import LSHParams
    from tokenmill.curate.dedup.minhash import MinHasher

KeepRule = Literal["first", "longest", "quality"]
MINHASH_DEVICES = ("numba", "cuda", "cpu")
INDEX_FORMAT = 1


@dataclass
class DedupConfig:
    method: Literal["fuzzy", "exact"] = option(
        "fuzzy", help="fuzzy: MinHash LSH near-duplicates; exact: identical normalized text (default fuzzy)"
    )
    # Default: "lower,punct" for fuzzy, "none" (whitespace collapsed only) for exact.
    normalize: str | None = option(
        None,
        help="comma list of lower, punct, nfkc, or none (whitespace is always collapsed); "
        "default lower,punct for fuzzy, none for exact",
    )
    keep: KeepRule = option(
        "first", help="which document of a cluster to keep: first in input order, longest, or highest quality_score"
    )
    # Fuzzy.
    threshold: float = option(0.8, group="fuzzy", help="Jaccard threshold (default 0.8)")
    num_perm: int = option(
        128, group="fuzzy", help="MinHash permutations per signature: more is more precise and slower (default 128)"
    )
    seed: int = option(1, group="fuzzy", help="seed of the MinHash permutations, as datasketch's seed (default 1)")
    scheme: str = option(
        "legacy",
        group="fuzzy",
        cli={"choices": ["legacy", "affine32", "fast"]},
        help="legacy = datasketch 1.x / 2.x scheme='legacy' (default); affine32 = datasketch 2.x default; "
        "fast = xxh64 + multiply-shift, NOT datasketch-compatible",
    )
    minhash_device: str = option(
        "numba",
        group="fuzzy",
        cli={"choices": list(MINHASH_DEVICES)},
        help="where the MinHash permutations run: numba (default, compiled CPU loops), or torch on cuda "
        "(a GPU) or cpu; the same signatures bit for bit; torch needs --scheme affine32 or fast",
    )
    bands: int | None = option(None, group="fuzzy", help="LSH bands (default: datasketch's optimum for --threshold)")
    rows: int | None = option(None, group="fuzzy", help="LSH rows per band (with --bands)")
    ngram: int = option(5, group="fuzzy", help="words per shingle (default 5)")
    char_ngram: int = option(5, group="fuzzy", help="characters per shingle for text without spaces")
    shingle: Literal["auto", "word", "char"] = option(
        "auto", group="fuzzy", help="auto: character n-grams for documents mostly in scripts without spaces (CJK, Thai)"
    )
    verify: bool = option(False, group="fuzzy", help="check every candidate pair by exact Jaccard of the shingle sets")
    all_pairs_limit: int = option(
        50,
        cli=False,
        help="buckets up to this size give every pair (so verification sees each pair); larger ones a star",
    )
    index: str | None = option(
        None,
        path="state",
        help="an index directory or URL: dedup against the documents of earlier runs, then add the kept ones "
        "to it (created if missing; it stores hashes for exact, band keys for fuzzy dedup)",
    )
    update_index: bool = option(True, flag="--no-index-update", help="query --index without adding the kept documents")
    # Set by a recipe step: what it added to the index is replaced, not queried, when it reruns.
    index_owner: str | None = option(
        None,
        cli=False,
        recipe=False,
        help="who owns this run's batch of the index: a later run of the same owner replaces that batch",
    )
    # Execution.
    work_dir: str | None = option(
        None,
        group="execution",
        recipe=False,
        help="checkpoints (default: .<output>.work beside --output); a rerun resumes there",
    )
    keep_work: bool = option(False, group="execution", recipe=False, help="keep the checkpoints after success")
    batch_rows: int = option(20_000, group="execution", help="documents per batch in a worker")
    partition_rows: int = option(2_000_000, cli=False, help="documents per partition of the shuffled tables")
    # Dask shuffle: "p2p" (disk-backed, bounded memory), "tasks", or "auto" = tasks when the
    # shuffled table fits one partition per worker (its fixed overhead is lower), else p2p.
    shuffle: str = option("auto", cli=False, help="Dask shuffle: p2p (disk-backed, bounded memory), tasks, or auto")

    def __post_init__(self) -> None:
        if self.method not in ("fuzzy", "exact"):
            raise ConfigError(f"--method must be fuzzy or exact, not {self.method!r}")
        if self.keep not in ("first", "longest", "quality"):
            raise ConfigError(f"--keep must be first, longest or quality, not {self.keep!r}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"--threshold must be in (0, 1), got {self.threshold}")
        if self.shuffle not in ("auto", "p2p", "tasks"):
            raise ConfigError(f"shuffle must be auto, p2p or tasks, not {self.shuffle!r}")
        if self.minhash_device not in MINHASH_DEVICES:
            raise ConfigError(
                f"--minhash-device must be one of {', '.join(MINHASH_DEVICES)}, not {self.minhash_device!r}"
            )
        if self.method == "fuzzy" and self.minhash_device != "numba":
            self._check_torch_device()
        if self.normalize is None:
            self.normalize = "lower,punct" if self.method == "fuzzy" else "none"
        _ = self.normalization  # validates
        if self.method == "fuzzy":
            self.lsh()  # validates bands/rows before any cluster starts

    def _check_torch_device(self) -> None:
        if self.scheme == "legacy":
            raise ConfigError(
                f"--minhash-device {self.minhash_device}: the legacy scheme (mod 2**61-1) runs with numba only; "
                "use --scheme affine32 (datasketch 2's default) or fast"
            )
        if self.minhash_device == "cuda":
            import torch  # only for a torch device: the parser stays light

            if not torch.cuda.is_available():
                raise ConfigError("--minhash-device cuda: no CUDA device is available; use cpu or numba")

    @property
    def normalization(self) -> TextNormalization:
        return parse_normalization(self.normalize)

    @property
    def shingles(self) -> ShingleConfig:
        return ShingleConfig(self.ngram, self.char_ngram, self.shingle, normalization=self.normalization)

    def hasher(self) -> MinHasher:
        from tokenmill.curate.dedup.minhash import MinHasher  # numba: loaded by a run, not by a parser

        return MinHasher(self.num_perm, self.seed, self.scheme, self.shingles, self.minhash_device)

    def lsh(self) -> LSHParams:
        from tokenmill.curate.dedup.lsh import LSHParams  # numba and pandas: loaded by a run, not by a parser

        return LSHParams.resolve(self.num_perm, self.threshold, self.bands, self.rows)

    def index_signature(self) -> dict[str, Any]:
        """What an index must share with a run that queries it."""
        if self.method == "exact":
            return {"format": INDEX_FORMAT, "method": "exact", "normalize": self.normalize}
        lsh = self.lsh()
        return {
            "format": INDEX_FORMAT,
            "method": "fuzzy",
            "num_perm": self.num_perm,
            "seed": self.seed,
            "scheme": self.scheme,
            "bands": lsh.bands,
            "rows": lsh.rows,
            "ngram": self.ngram,
            "char_ngram": self.char_ngram,
            "shingle": self.shingle,
            "normalize": self.normalize,
        }

    @property
    def index_rows_dir(self) -> str:
        """The index's folder of per-document rows: text hashes (exact) or band keys (fuzzy),
        the same rows the run's first phase writes to its work directory."""
        return "hashes" if self.method == "exact" else "bands"

    @property
    def first_phase(self) -> str:
        return "hashes" if self.method == "exact" else "signatures"
