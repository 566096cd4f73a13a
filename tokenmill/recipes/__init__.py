"""Recipes that ship inside tokenmill, so `tokenmill train tiny` and `tokenmill run mtnlg` work
from any directory after a plain `pip install` (the repository's `recipes/` links here)."""

from __future__ import annotations

from pathlib import Path

from tokenmill.errors import TokenmillError

BUNDLED_DIR = Path(__file__).parent


TRAIN_PREFIX = "train-"


def bundled_recipes(prefix: str = "") -> dict[str, Path]:
    """Bundled recipe files by name: the file stem without `prefix` (`train-tiny.yaml` -> `tiny`).
    Without a prefix: the pipeline recipes (`tokenmill run`), not the training configs."""
    return {
        path.stem.removeprefix(prefix): path
        for path in sorted(BUNDLED_DIR.glob(f"{prefix}*.yaml"))
        if prefix or not path.stem.startswith(TRAIN_PREFIX)
    }


def resolve_recipe(spec: str, prefix: str = "") -> tuple[Path, bool]:
    """A recipe given as a file path or as a bundled name; returns (path, is_bundled).

    A path that exists wins over a bundled name, so a user's own `tiny` file is never shadowed.
    """
    from tokenmill.infra import storage

    if not storage.Location(spec).is_local:
        return spec, False  # type: ignore[return-value]  # read through the storage layer
    path = Path(spec).expanduser()
    if path.is_file():
        return path, False
    bundled = bundled_recipes(prefix)
    name = spec.removesuffix(".yaml").removesuffix(".yml")
    if name in bundled and not path.parent.parts:
        return bundled[name], True
    if "/" in spec or spec.endswith((".yaml", ".yml")):
        raise TokenmillError(f"recipe file not found: {spec} (bundled recipes: {', '.join(bundled)})")
    raise TokenmillError(f"no recipe file or bundled recipe named {spec!r} (bundled: {', '.join(bundled)})")
