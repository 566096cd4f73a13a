"""The rules of docs/architecture.md, checked from the source.

- Layers: a module imports only from its own layer or a layer below it (`LAYERS`); imports
  inside functions count.
- No import cycle: no two modules import each other, directly or through others (a package's
  `__init__` re-exporting its own submodules is not a cycle of design).
- No `try: import ... except ImportError` around the project's own modules.
- No function longer than `MAX_FUNCTION_LINES`.
- Every module, file and code name the page cites exists (`cited_names_missing` says which
  spans count as citations).

And two rules of the repository's text: it cites no file outside the repository (but the test
data under ../shared/data), and every `make TARGET` it names is one the Makefile defines.

Each checker reads the repository root it is given, so the tests below also run it on a tiny
repository made in tmp_path, with planted violations of each rule.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "tokenmill"
MAX_FUNCTION_LINES = 100

# Bottom to top, as docs/architecture.md draws them: the first component under `tokenmill.`
# names the layer ("" is the package's own __init__).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"", "errors", "problems", "logs", "progress"}),
    frozenset({"infra", "entry", "recipes"}),
    frozenset({"curate", "tokenize", "train", "eval"}),
    frozenset({"pipelines"}),
    frozenset({"cli", "__main__"}),
)


@dataclass
class Source:
    """The package's modules (dotted name -> file) and the imports between them."""

    root: Path
    modules: dict[str, Path] = field(default_factory=dict)
    trees: dict[str, ast.Module] = field(default_factory=dict)
    imports: dict[str, set[str]] = field(default_factory=dict)

    def relative(self, module: str) -> str:
        return self.modules[module].relative_to(self.root).as_posix()


def read_source(root: Path, package: str = PACKAGE) -> Source:
    source = Source(root)
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        source.modules[".".join(parts)] = path
    for module, path in source.modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        source.trees[module] = tree
        source.imports[module] = {
            target
            for node in ast.walk(tree)
            for target in imported_modules(node, module, path.name == "__init__.py", source.modules, package)
            if target != module
        }
    return source


def imported_modules(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path], package: str) -> set[str]:
    """The package's modules an import statement loads (`from a import b` loads `a.b` if it is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and (name == package or name.startswith(package + ".")):
            found.add(name)
    return found


def layer_of(module: str) -> int:
    top = (module.split(".") + [""])[1]
    return next(rank for rank, names in enumerate(LAYERS) if top in names)


def upward_imports(source: Source) -> list[str]:
    return [
        f"upward import: {module} -> {target}"
        for module, targets in sorted(source.imports.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def import_cycles(source: Source) -> list[str]:
    """Strongly connected components of the import graph (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[str] = []
    for start in sorted(source.imports):
        if start in index:
            continue
        work = [(start, iter(sorted(source.imports[start])))]
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = lowlink[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(source.imports.get(target, ())))))
                elif target in on_stack:
                    lowlink[node] = min(lowlink[node], index[target])
                continue
            work.pop()
            if work:
                lowlink[work[-1][0]] = min(lowlink[work[-1][0]], lowlink[node])
            if lowlink[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                component.sort()
                package_reexport = source.modules[component[0]].name == "__init__.py" and all(
                    member.startswith(component[0] + ".") for member in component[1:]
                )
                if len(component) > 1 and not package_reexport:
                    cycles.append("import cycle: " + " <-> ".join(component))
    return cycles


def long_functions(source: Source, max_lines: int = MAX_FUNCTION_LINES) -> list[str]:
    return [
        f"function over {max_lines} lines: {source.relative(module)}:{node.lineno} {node.name} "
        f"({node.end_lineno - node.lineno + 1})"
        for module, tree in sorted(source.trees.items())
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > max_lines
    ]


def import_error_guards(source: Source, package: str = PACKAGE) -> list[str]:
    """`try:` blocks that import one of the project's modules and catch ImportError."""

    def own_import(node: ast.AST) -> bool:
        if isinstance(node, ast.ImportFrom):
            return bool(node.level) or (node.module or "").split(".")[0] == package
        return isinstance(node, ast.Import) and any(alias.name.split(".")[0] == package for alias in node.names)

    return [
        f"ImportError guard around the project's own import: {source.relative(module)}:{node.lineno}"
        for module, tree in sorted(source.trees.items())
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(own_import(inner) for statement in node.body for inner in ast.walk(statement))
        and any(
            isinstance(handler.type, ast.Name) and handler.type.id in ("ImportError", "ModuleNotFoundError")
            for handler in node.handlers
        )
    ]


# Names the page cites that are not the project's: datatrove's class, the model of `Location`.
EXTERNAL_NAMES = frozenset({"DataFolder"})
FENCED_BLOCK = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_SPAN = re.compile(r"^(?P<path>[\w/-]+(?:\.py|\.yaml|\.txt|/))(?:::(?P<test>\w+))?$")
DOTTED_SPAN = re.compile(r"^(?P<owner>[\w/.]+)\.(?P<name>\w+)(?:\(.*\))?$")
# `PREFIX.bin`, `manifest.json`: file names, not code.
FILE_SUFFIXES = frozenset({"bin", "idx", "json", "npy", "parquet"})
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


def top_level_names(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body defines: functions, classes, assignments, imports."""
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(target.id for target in statement.targets if isinstance(target, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
        elif isinstance(statement, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
    return names


def class_members(tree: ast.Module) -> dict[str, set[str]]:
    """Each class of a module and its members: its body's names and the `self.NAME` it assigns."""
    members: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            assigned = {
                target.attr
                for inner in ast.walk(node)
                if isinstance(inner, ast.Assign | ast.AnnAssign)
                for target in (inner.targets if isinstance(inner, ast.Assign) else [inner.target])
                if isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            }
            members.setdefault(node.name, set()).update(top_level_names(node.body) | assigned)
    return members


def cited_names_missing(page: Path, source: Source, package: str = PACKAGE) -> list[str]:
    """The code a page cites that does not exist. A citation is a `code span` outside fenced
    blocks that is:
    - a path ending in `.py`, `.yaml`, `.txt` (anywhere) or `/` (in a table row), optionally
      `::test_name`: a file found from the repository root, from the package, or from the
      directory of a path cited earlier in the same paragraph or table row;
    - `module.name` or `dir/module.name`, `(...)` allowed after it, whose first part is one of
      the package's modules (by dotted path or by its last component, if that is unique) or
      classes: the module or class defines the name (a standard-library module's names and
      file names such as `manifest.json` are not checked);
    - a bare identifier in a table row, or one that reads as a code name anywhere (it has an
      underscore or a capital letter): a module of the package, or a name one defines (at its
      top level or in a class, `self.NAME` included).
    """
    package_dir = source.root / package
    definitions = {module: top_level_names(tree.body) for module, tree in source.trees.items()}
    by_last_part: dict[str, list[str]] = {}
    for module in source.modules:
        by_last_part.setdefault(module.rpartition(".")[2], []).append(module)
    classes: dict[str, set[str]] = {}
    for tree in source.trees.values():
        for name, members in class_members(tree).items():
            classes.setdefault(name, set()).update(members)
    every_name = set(by_last_part).union(*definitions.values(), *classes.values(), EXTERNAL_NAMES, dir(builtins))

    def module_named(owner: str) -> str | None:
        dotted = owner.replace("/", ".")
        for candidate in (f"{package}.{dotted}", dotted):
            if candidate in source.modules:
                return candidate
        matches = by_last_part.get(dotted, [])
        return matches[0] if len(matches) == 1 else None

    def file_found(path: str, context: list[Path]) -> Path | None:
        for base in (source.root, package_dir, *context):
            if (base / path).exists():
                return base / path
        return None

    missing: list[str] = []
    text = FENCED_BLOCK.sub(lambda block: "\n" * block.group().count("\n"), page.read_text())
    paragraph_context: list[Path] = []
    for number, line in enumerate(text.splitlines(), 1):
        in_table = line.lstrip().startswith("|")
        if in_table or not line.strip():
            paragraph_context = []
        context = paragraph_context if not in_table else []
        for span in CODE_SPAN.findall(line):
            where = f"{page.name}:{number}: `{span}`"
            path_match = PATH_SPAN.match(span)
            dotted_match = DOTTED_SPAN.match(span)
            if path_match and (in_table or not span.endswith("/")):
                found = file_found(path_match["path"], context)
                if found is None:
                    missing.append(f"{where}: no such file")
                    continue
                context.append(found if found.is_dir() else found.parent)
                test = path_match["test"]
                if test and test not in top_level_names(ast.parse(found.read_text()).body):
                    missing.append(f"{where}: no test {test}")
            elif dotted_match and not path_match:
                owner, name = dotted_match["owner"], dotted_match["name"]
                module = module_named(owner)
                if module is not None:
                    if name not in definitions[module] and module_named(f"{owner}.{name}") is None:
                        missing.append(f"{where}: {module} defines no {name}")
                elif owner in classes:
                    if name not in classes[owner]:
                        missing.append(f"{where}: class {owner} has no {name}")
                elif owner.split(".")[0] not in sys.stdlib_module_names and name not in FILE_SUFFIXES:
                    missing.append(f"{where}: no module or class {owner}")
            elif IDENTIFIER.match(span) and (in_table or "_" in span or span != span.lower()):
                if span not in every_name:
                    missing.append(f"{where}: no module or name {span}")
    return missing


def structure_findings(source: Source) -> list[str]:
    return upward_imports(source) + import_cycles(source) + long_functions(source) + import_error_guards(source)


@pytest.fixture(scope="module")
def package_source() -> Source:
    return read_source(REPO_ROOT)


def test_the_package_follows_the_architecture_rules(package_source: Source) -> None:
    assert structure_findings(package_source) == []


def test_every_module_and_name_docs_architecture_cites_exists(package_source: Source) -> None:
    assert cited_names_missing(REPO_ROOT / "docs" / "architecture.md", package_source) == []


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


CLEAN_PACKAGE = {
    "__init__.py": "",
    "errors.py": "class TokenmillError(Exception):\n    pass\n",
    "infra/__init__.py": "",
    "infra/storage.py": "from tokenmill.errors import TokenmillError\n\n\nclass Location:\n    def join(self): ...\n",
    "curate/__init__.py": "",
    "curate/stage.py": "from ..infra import storage\n\n\ndef run_stage():\n    import tokenmill.infra.storage\n",
    "cli.py": "from tokenmill.curate import stage\n",
}


def test_the_checks_pass_a_clean_package_and_find_each_planted_violation(tmp_path: Path) -> None:
    write_package(tmp_path / "clean", CLEAN_PACKAGE)
    assert structure_findings(read_source(tmp_path / "clean")) == []

    long_body = "".join(f"    x{n} = {n}\n" for n in range(MAX_FUNCTION_LINES))
    planted = {
        # upward, and only inside a function: infra imports a stage
        "infra/storage.py": CLEAN_PACKAGE["infra/storage.py"]
        + "\n\ndef f():\n    from tokenmill.curate import stage\n",
        # a cycle through a relative import inside a function, and a guard around our own import
        "curate/stage.py": CLEAN_PACKAGE["curate/stage.py"]
        + "\n\ndef g():\n    from . import dedup\n\n\ntry:\n    from .dedup import h\nexcept ImportError:\n    h = None\n",
        "curate/dedup.py": "from tokenmill.curate.stage import run_stage\n\n\ndef h():\n" + long_body,
        # the bottom layer imports infra
        "errors.py": CLEAN_PACKAGE["errors.py"] + "from tokenmill.infra import storage\n",
    }
    write_package(tmp_path / "planted", {**CLEAN_PACKAGE, **planted})
    findings = structure_findings(read_source(tmp_path / "planted"))
    assert findings == [
        "upward import: tokenmill.errors -> tokenmill.infra",
        "upward import: tokenmill.errors -> tokenmill.infra.storage",
        "upward import: tokenmill.infra.storage -> tokenmill.curate",
        "upward import: tokenmill.infra.storage -> tokenmill.curate.stage",
        "import cycle: tokenmill.curate.dedup <-> tokenmill.curate.stage <-> tokenmill.errors <-> tokenmill.infra.storage",
        f"function over {MAX_FUNCTION_LINES} lines: tokenmill/curate/dedup.py:4 h ({MAX_FUNCTION_LINES + 1})",
        "ImportError guard around the project's own import: tokenmill/curate/stage.py:12",
    ]


def test_cited_names_are_found_and_missing_ones_named(tmp_path: Path) -> None:
    write_package(tmp_path, CLEAN_PACKAGE)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "timing.py").write_text("")
    page = tmp_path / "architecture.md"
    page.write_text(
        "# Layers\n\n```text\n`tokenmill/nowhere.py` in a fenced block is not a citation\n```\n\n"
        "`infra/storage.py` holds `storage.Location(path)`, whose `Location.join` joins; `curate/stage.py`\n"
        "(`stage.py` in the rest of the paragraph) runs `stage.run_stage()`. `bench/timing.py`, `kept/`,\n"
        "`sys.modules`, `manifest.json`, `ImportError` and `id` are found or not checked. `DataFolder` is datatrove's.\n\n"
        "| Package | What | Start |\n|---|---|---|\n"
        "| `infra/` | `storage`, `run_stage`, `missing_module` | `storage.py`, `gone.py` |\n\n"
        "`stage.py` has no context here; `storage.Mirror` and `Location.push` are gone, so are `curate/rules/`\n"
        "(not checked: a directory outside a table), `curate/rules.py`, `run_stages`, `tests/x.py::test_y`\n"
        "and `bench/timing.py::test_gone`.\n"
    )
    assert cited_names_missing(page, read_source(tmp_path)) == [
        "architecture.md:13: `missing_module`: no module or name missing_module",
        "architecture.md:13: `gone.py`: no such file",
        "architecture.md:15: `stage.py`: no such file",
        "architecture.md:15: `storage.Mirror`: tokenmill.infra.storage defines no Mirror",
        "architecture.md:15: `Location.push`: class Location has no push",
        "architecture.md:16: `curate/rules.py`: no such file",
        "architecture.md:16: `run_stages`: no module or name run_stages",
        "architecture.md:16: `tests/x.py::test_y`: no such file",
        "architecture.md:17: `bench/timing.py::test_gone`: no test test_gone",
    ]


# The files the project's text is in: code, tests, benchmarks and their results, docs, recipes.
PROJECT_TEXT_ROOTS = ("README.md", "pyproject.toml", "Makefile", "docs", "tokenmill", "tests", "bench", "recipes")
PROJECT_TEXT_SUFFIXES = frozenset({".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".txt", ".html", ".cfg", ""})
# A capitalised Markdown page (NOTES.md) must be one of the repository's own.
CAPITALISED_PAGE = re.compile(r"\b[A-Z][A-Z0-9_]*\.md\b")
# A path beside the clone: only the shared test data (../shared/data) is the project's to name.
BESIDE_THE_CLONE = re.compile(r"(?<![\w/.])(?:\.\./)+shared/(?!data\b)\S*|\bshared/tools\b\S*")


def project_text_files(root: Path) -> list[Path]:
    files = []
    for name in PROJECT_TEXT_ROOTS:
        path = root / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        files += [
            file
            for file in candidates
            if file.is_file()
            and file.suffix in PROJECT_TEXT_SUFFIXES
            and "__pycache__" not in file.parts
            # this file names violations, to test the checks on them
            and file != Path(__file__).resolve()
        ]
    return files


def citations_outside(root: Path) -> list[str]:
    """Each place a project file cites a file the repository does not hold."""
    files = project_text_files(root)
    page_names = {file.name for file in files}
    found = []
    for file in files:
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            cited = [name for name in CAPITALISED_PAGE.findall(line) if name not in page_names]
            cited += BESIDE_THE_CLONE.findall(line)
            found += [f"{file.relative_to(root).as_posix()}:{number}: {name}" for name in cited]
    return found


def test_the_repository_cites_no_file_outside_it() -> None:
    assert citations_outside(REPO_ROOT) == []


def test_citations_of_files_outside_the_repository_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("See docs/NOTICE.md and README.md; data in ../shared/data/wiki.\n")
    (tmp_path / "docs" / "NOTICE.md").write_text("")
    (tmp_path / "docs" / "design.md").write_text(
        "As DESIGN.md says, run\n../shared/tools/check.py or shared/tools/x.\n"
    )
    (tmp_path / "Makefile").write_text("check:\n\tpython3 ../../shared/bin/lint.py\n")
    assert citations_outside(tmp_path) == [
        "Makefile:2: ../../shared/bin/lint.py",
        "docs/design.md:1: DESIGN.md",
        "docs/design.md:2: ../shared/tools/check.py",
        "docs/design.md:2: shared/tools/x.",
    ]


MAKE_IN_CODE_SPAN = re.compile(r"`make ([\w-]+)")
MAKE_COMMAND_LINE = re.compile(r"^\s*make ([\w-]+)", re.M)
MAKE_TARGET = re.compile(r"^([\w-]+):", re.M)


def unknown_make_targets(root: Path) -> list[str]:
    """Each `make TARGET` the project's text names (in a code span, or as a command line of a
    Markdown code block) that the Makefile does not define."""
    targets = set(MAKE_TARGET.findall((root / "Makefile").read_text()))
    unknown = []
    for file in project_text_files(root):
        text = file.read_text(errors="replace")
        named = [(match.start(), match.group(1)) for match in MAKE_IN_CODE_SPAN.finditer(text)]
        if file.suffix == ".md":
            for block in FENCED_BLOCK.finditer(text):
                named += [(block.start() + m.start(), m.group(1)) for m in MAKE_COMMAND_LINE.finditer(block.group())]
        unknown += [
            f"{file.relative_to(root).as_posix()}:{text.count(chr(10), 0, at) + 1}: make {target}"
            for at, target in sorted(named)
            if target not in targets
        ]
    return unknown


def test_every_make_target_the_project_names_exists() -> None:
    assert unknown_make_targets(REPO_ROOT) == []


def test_a_make_target_the_makefile_lacks_is_found(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text("test: install\n\tpytest\n\ninstall:\n\tpip install .\n")
    (tmp_path / "README.md").write_text("Run `make test`, or\n\n```bash\nmake install\nmake test-all\n```\n")
    (tmp_path / "pyproject.toml").write_text('markers = ["slow: run by `make test-all`"]\n')
    assert unknown_make_targets(tmp_path) == ["README.md:5: make test-all", "pyproject.toml:1: make test-all"]
