"""Every shell block of README.md and docs/*.md runs, as written, in order.

A block fenced as ```bash is a command a user types: this test runs each one with `bash -e`
in a fresh directory laid out as a clone sits beside the shared data (`WORK/project` with
`WORK/shared/data` next to it), so `../shared/data` in the docs resolves literally and no text
is substituted. Blocks fenced otherwise (```text for templates with placeholders and sample
output, ```yaml, ```python) are not run; `make demo` / `make test` are run by CI itself.

README.md runs first; each docs page then runs in a copy of the directory the README left,
as a reader who followed the README would have it. Comment lines inside a block show output.

The commands' Dask work goes to the test session's LocalCluster through Dask's own
`DASK_SCHEDULER_ADDRESS` (tests/conftest.py), as a user's shell on a cluster would name one,
instead of each command starting a LocalCluster of its own: the results are the same
(tests/curate/test_dask_cluster.py), and a hundred cluster start-ups are not what these pages
document.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from run_once import shared_between_workers

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC_PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
BLOCK_TIMEOUT_S = 900
# A path of the repository's code as the pages name it: from its root, or inside tokenmill/.
CODE_PATH = re.compile(
    r"(?<![\w/.])(?:(?:tokenmill|tests|bench)/|(?:curate|tokenize|train|eval|pipelines|infra)/)[\w/]+\.py\b"
)


def shell_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of each ```bash block, in order."""
    blocks = []
    for match in FENCE.finditer(markdown):
        if match.group(1) == "bash":
            blocks.append((markdown.count("\n", 0, match.start()) + 1, match.group(2)))
    return blocks


def run_page(page: Path, cwd: Path) -> None:
    env = dict(os.environ)
    # `tokenmill` is the one installed beside the Python running the tests.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TOKENMILL_SHARED_DATA", None)  # the docs name ../shared/data; nothing else finds it
    for line, block in shell_blocks(page.read_text()):
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            # Ctrl-C as on a terminal, also when the test run was started with SIGINT ignored (in
            # the background of a non-interactive shell): the pages' `kill -INT` must stop a run.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-4000:]
            pytest.fail(f"{page.name}:{line}: block exited with {done.returncode}\n{block}\n--- output ---\n{output}")


@pytest.fixture(scope="session")
def readme_workspace(shared_data: Path, tmp_path_factory) -> Path:
    """The directory README.md's blocks leave, built once per test run (also across xdist
    workers: the doc pages run in parallel, each in a copy)."""

    def build(root: Path) -> None:
        (root / "shared").mkdir()
        (root / "shared" / "data").symlink_to(shared_data.resolve(), target_is_directory=True)
        (root / "project").mkdir()
        run_page(REPO_ROOT / "README.md", root / "project")

    return shared_between_workers(tmp_path_factory, "readme-workspace", build) / "project"


@pytest.mark.slow
def test_readme_blocks_run(readme_workspace: Path) -> None:
    assert (readme_workspace / "work").is_dir()


def test_every_doc_page_has_runnable_blocks() -> None:
    """Pages that show commands show them as runnable blocks (a page may have none)."""
    for page in [REPO_ROOT / "README.md", *DOC_PAGES]:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) in ("", "sh", "shell", "console"):
                body = match.group(2)
                line = text.count("\n", 0, match.start()) + 1
                if re.search(r"^\s*tokenmill ", body, re.M) and "make demo" not in body:
                    pytest.fail(
                        f"{page.name}:{line}: tokenmill commands in an unlabelled block: fence it as ```bash"
                        " (run by this test) or ```text (a template)"
                    )


@pytest.mark.slow
@pytest.mark.parametrize("page", DOC_PAGES, ids=[p.stem for p in DOC_PAGES])
def test_doc_page_blocks_run(page: Path, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not shell_blocks(page.read_text()):
        pytest.skip(f"{page.name} has no shell blocks")
    readme_workspace = request.getfixturevalue("readme_workspace")
    workspace = tmp_path / "project"
    shutil.copytree(readme_workspace, workspace, symlinks=True)
    (tmp_path / "shared").symlink_to(readme_workspace.parent / "shared", target_is_directory=True)
    run_page(page, workspace)


def test_every_file_the_pages_name_exists() -> None:
    """A module, test or benchmark the pages name by its path is there (a path inside the
    package, `curate/stage.py`, is read under tokenmill/): a moved module leaves no page behind."""
    missing = []
    for page in [REPO_ROOT / "README.md", *DOC_PAGES]:
        for match in CODE_PATH.finditer(page.read_text()):
            path = match.group(0)
            if not (REPO_ROOT / path).exists() and not (REPO_ROOT / "tokenmill" / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing
