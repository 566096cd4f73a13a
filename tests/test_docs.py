"""Every shell block of README.md and docs/*.md runs, as written, in order.

A block fenced as ```bash is a command a user types: this test runs each one with `bash -e`
in a fresh directory laid out as a clone sits beside the shared data (`WORK/project` with
`WORK/shared/data` next to it), so `../shared/data` in the docs resolves literally and no text
is substituted. Blocks fenced otherwise (```text for templates with placeholders and sample
output, ```yaml, ```python) are not run; `make demo` / `make test` are run by CI itself.

README.md runs first; each docs page then runs in a copy of the directory the README left,
as a reader who followed the README would have it.

Comment lines inside a block show output. The `#` lines directly below a command (no blank line
between) are what it prints: each of them that holds a number must match a line the block
printed that starts with the same word, its numbers appearing there in the same order, but for
those that change from run to run (a duration such as `2.9s`, a rate in tokens/s, `memory_gib`,
a process id). A comment that explains rather than shows output stands apart from the command
above it, after a blank line.

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

# A number standing alone (`kept 812`, `3.3%`, `0.8829`), not one inside a name (`step_60`) or
# one with a unit glued to it (`2.9s`). VARYING: what differs between runs of the same command, and
# the extractor children a stage started, none when the session's shared Dask workers have one.
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w.])")
VARYING = re.compile(r"\bpid \d+|[\d,.]+ tokens/s|\b(?:tokens_per_s|memory_gib) [\d.]+|'extractor_processes': \d+")


def shell_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of each ```bash block, in order."""
    blocks = []
    for match in FENCE.finditer(markdown):
        if match.group(1) == "bash":
            blocks.append((markdown.count("\n", 0, match.start()) + 1, match.group(2)))
    return blocks


def output_comments(block: str) -> list[tuple[int, str]]:
    """(line in the block, text) of each `#` line that directly follows a command, or another
    such line, and holds a number."""
    shown = []
    after_command = False
    for number, line in enumerate(block.splitlines()):
        text = line.strip()
        if text.startswith("#"):
            if after_command and NUMBER.search(VARYING.sub("", text)):
                shown.append((number, text.removeprefix("#").strip()))
        else:
            after_command = bool(text)
    return shown


def numbers_of(line: str) -> list[str]:
    return NUMBER.findall(VARYING.sub("", line))


def bears_out(line: str, comment: str) -> bool:
    """Whether an output line is the one a comment shows: the same first word, and the comment's
    numbers in it in the same order."""
    found = iter(numbers_of(line))
    return line.split()[:1] == comment.split()[:1] and all(value in found for value in numbers_of(comment))


def unmatched_output_comments(block: str, output: str) -> list[tuple[int, str]]:
    """The output comments of a block that no line of its output bears out."""
    lines = [line.strip() for line in output.splitlines()]
    return [
        (number, comment)
        for number, comment in output_comments(block)
        if not any(bears_out(line, comment) for line in lines)
    ]


def run_page(page: Path, cwd: Path) -> None:
    env = dict(os.environ)
    # `tokenmill` is the one installed beside the Python running the tests.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TOKENMILL_SHARED_DATA", None)  # the docs name ../shared/data; nothing else finds it
    # A wrong output comment does not stop the page (the next blocks do not depend on it): the
    # page runs to its end and the test names every wrong comment at once.
    wrong_comments: list[str] = []
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
        unmatched = unmatched_output_comments(block, done.stdout + done.stderr)
        if unmatched:
            comments = "\n".join(f"{page.name}:{line + 1 + number}: # {comment}" for number, comment in unmatched)
            wrong_comments.append(f"{comments}\n--- output ---\n{(done.stdout + done.stderr)[-4000:]}")
    if wrong_comments:
        pytest.fail("output comments that the commands do not print:\n" + "\n\n".join(wrong_comments))


def test_output_comments_are_compared_with_what_the_block_prints() -> None:
    block = (
        "# ingest the corpus: 3 files\n"  # above any command: an explanation
        "tokenmill curate ingest --input corpus --output work/docs\n"
        "# ingest: in 65, kept 64, rejected 1 in 3.1s -> work/docs\n"
        "#   empty_text: 1\n"
        "#   ...\n"
        "tokenmill train tiny --data shards --out runs/long &\n"
        "# step 5 | loss 7.9164 | tokens_per_s 6325 | memory_gib 0.62\n"
        "\n"
        "# 2 more steps: an explanation after a blank line\n"
        "tokenmill curate filter --input work/docs --output work/filter\n"
        "# c4 removed 79 of 142 lines and edited 4 kept documents\n"
        "# tokenmill: error: runs/long is being written by another `tokenmill train` (pid 18405)\n"
    )
    # the last comment holds only a process id: nothing to compare
    assert [number for number, _ in output_comments(block)] == [2, 3, 6, 10]
    printed = (
        "ingest: in 65, kept 64, rejected 1 in 2.2s -> /tmp/x1/work/docs\n  empty_text: 1\n"
        "step 5 | loss 7.9164 | tokens_per_s 9999 | memory_gib 0.71\n"
        "c4 removed 79 of 142 lines and edited 4 kept documents\n"
        "tokenmill: error: runs/long is being written by another `tokenmill train` (pid 31337)\n"
    )
    assert unmatched_output_comments(block, printed) == []
    wrong = printed.replace("kept 64, rejected 1", "kept 63, rejected 2").replace("removed 79", "removed 80")
    assert unmatched_output_comments(block, wrong) == [
        (2, "ingest: in 65, kept 64, rejected 1 in 3.1s -> work/docs"),
        (10, "c4 removed 79 of 142 lines and edited 4 kept documents"),
    ]
    # the comment's first word must start the line: `empty_text: 1` is not borne out by `ingest: ... 1`
    assert unmatched_output_comments(block, printed.replace("  empty_text: 1\n", "")) == [(3, "empty_text: 1")]


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
