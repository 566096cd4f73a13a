"""The `python-docs` source: a real English corpus that every Python installation carries.

Three kinds of documents, each recorded in `source` as `python-docs/<kind>`:

- `topics`: the help topics of the language reference (`pydoc_data.topics.topics`), the text
  `help("if")` prints.
- `stdlib`: docstrings of the standard library's modules, read from their source files with
  `ast` (nothing is imported, so no module runs code).
- `packages`: the `METADATA` descriptions and `LICENSE` files of the installed distributions
  in site-packages. Licences are natural near-duplicates (dozens of MIT and BSD texts that
  differ in a name and a year), which is what fuzzy deduplication is for.

The corpus is written as JSONL (`id`, `text`, `source`) in a fixed order, so two builds on the
same installation are identical and its fingerprint is a hash of its content.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from tokenmill.infra.atomic import atomic_path

# Docstrings shorter than this are one-liners ("Constants.") rather than prose.
MIN_CHARS = 200


def _topics() -> Iterator[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        return
    for name in sorted(topics):
        yield f"topics/{name}", topics[name]


def _stdlib() -> Iterator[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "dist-packages"}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in skip for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        doc = ast.get_docstring(tree)
        if doc:
            yield f"stdlib/{rel.as_posix()}", doc


def _packages() -> Iterator[tuple[str, str]]:
    seen: set[str] = set()
    dists = sorted(metadata.distributions(), key=lambda d: ((d.metadata["Name"] or "").lower(), d.version or ""))
    for dist in dists:
        name = (dist.metadata["Name"] or "").lower()
        if not name or name in seen:
            continue
        seen.add(name)
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        description = body or dist.metadata.get("Description") or ""
        if description:
            yield f"packages/{name}/METADATA", description
        for file in sorted(dist.files or [], key=str):
            base = file.name.upper()
            if base.startswith(("LICENSE", "LICENCE", "COPYING")) and file.suffix.lower() in (
                "",
                ".txt",
                ".md",
                ".rst",
            ):
                try:
                    text = file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                yield f"packages/{name}/{file.as_posix().split('/')[-2]}/{file.name}", text


KINDS = {"topics": _topics, "stdlib": _stdlib, "packages": _packages}


def iter_documents(max_documents: int | None = None) -> Iterator[dict[str, str]]:
    """Documents of every kind, in a stable order; `max_documents` caps each kind."""
    for kind, generate in KINDS.items():
        n = 0
        for doc_id, text in generate():
            if len(text.strip()) < MIN_CHARS:
                continue
            yield {"id": doc_id, "text": text, "source": f"python-docs/{kind}"}
            n += 1
            if max_documents is not None and n >= max_documents:
                break


def build_corpus(output: str | Path, max_documents: int | None = None) -> dict[str, object]:
    """Write the corpus as JSONL atomically; return counts per kind and a content hash."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    counts: dict[str, int] = {}
    chars = 0
    with atomic_path(output) as tmp, tmp.open("w", encoding="utf-8") as f:
        for doc in iter_documents(max_documents):
            line = json.dumps(doc, ensure_ascii=False) + "\n"
            f.write(line)
            digest.update(line.encode())
            counts[doc["source"]] = counts.get(doc["source"], 0) + 1
            chars += len(doc["text"])
    return {"documents": counts, "chars": chars, "sha256": digest.hexdigest(), "python": sys.version.split()[0]}


def installation_fingerprint() -> str:
    """Cheap identity of what the corpus would contain: Python version and installed
    distributions. Used in the source's fingerprint instead of hashing the corpus up front."""
    h = hashlib.sha256(sys.version.encode())
    for dist in sorted(metadata.distributions(), key=lambda d: ((d.metadata["Name"] or "").lower(), d.version or "")):
        h.update(f"{dist.metadata['Name']}=={dist.version};".encode())
    return h.hexdigest()[:16]
