"""docs/code-map.md stays true: its paths exist, its ``path:name`` references name something
defined in that file, and every directory holding tracked files has a line in its directory map.

Conventions of the map that this test reads (stated at the top of the map):

* a backquoted token is a repository path when its first component is a top-level entry of the
  repository (``collector/...``, ``Makefile``); it must exist.  Tokens with placeholders
  (``<part>``, ``{id}``) are prose, not paths; a ``*`` is a glob that must match something.
* ``path.py:name`` (or ``path.py:Class.method``, ``path.py:outer.inner``) names a function, class
  or module-level constant defined in that file (checked with ``ast``, nothing is imported).
* the directory map is the list under the heading "Directory map": each item starts with the
  backquoted directory (``./`` for the root); bare file names later on an item's line
  (``api.py``, ``_tap*.py``, ``inventory/``) are relative to that directory and must exist too.

Fenced code blocks (the drawing) are not read.
"""

from __future__ import annotations

import ast
import functools
import glob
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pure code (git ls-files), no root, no services

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "code-map.md"

#: Directories with tracked files that have no line of their own, and the line that covers them
#: (which must itself be in the map and, in the map's words, say that it covers them).
#: Kept short on purpose: only folders that are data, or one Ansible role's fixed layout.
COVERED_BY_PARENT = {
    # world map outlines (one JSON file), data served with the assets
    "dashboard/src/iwscope_dashboard/assets/topojson": "dashboard/src/iwscope_dashboard/assets",
    # an example inventory and Ansible's fixed role layout: one file each, described as a whole
    "probe/deploy/ansible/inventory": "probe/deploy/ansible",
    "probe/deploy/ansible/roles/iwprobe/defaults": "probe/deploy/ansible",
    "probe/deploy/ansible/roles/iwprobe/handlers": "probe/deploy/ansible",
    "probe/deploy/ansible/roles/iwprobe/meta": "probe/deploy/ansible",
    "probe/deploy/ansible/roles/iwprobe/tasks": "probe/deploy/ansible",
    "probe/deploy/ansible/roles/iwprobe/templates": "probe/deploy/ansible",
}

#: A bare token on a directory-map line that is a file name (a short extension, or Makefile);
#: other tokens there (commands, dotted Python names, tables, settings) are prose.
_FILE_NAME = re.compile(r"^(?:[\w*.-]*\.[A-Za-z]{1,5}|Makefile)$")

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TICKED = re.compile(r"`([^`\n]+)`")
_REFERENCE = re.compile(r"^(?P<path>[\w./-]+\.py):(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")
_MAP_ITEM = re.compile(r"^\s*[-*]\s+`(?P<directory>[^`]+)`(?P<rest>.*)$")
_PLACEHOLDER = re.compile(r"[<>{}\s]")


def _prose(text: str) -> str:
    """The map without its fenced code blocks."""
    return _FENCE.sub("", text)


@functools.cache
def _map_text() -> str:
    return _prose(MAP.read_text(encoding="utf-8"))


@functools.cache
def _tracked_files() -> tuple[str, ...] | None:
    """Every tracked file; None without ``.git`` (not a checkout).  In a checkout git must answer:
    a failure fails the test instead of skipping the directory check unseen."""
    if not (ROOT / ".git").exists():
        return None
    command = ["git", "-c", "safe.directory=*", "ls-files", "-z"]
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"{' '.join(command)} could not run in a checkout: {error}")
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.decode(errors='replace').strip()}")
    return tuple(name for name in result.stdout.decode().split("\0") if name)


def _top_level() -> set[str]:
    tracked = _tracked_files()
    if tracked is None:
        return {entry for entry in os.listdir(ROOT) if entry not in {".git", ".venv"}}
    return {name.split("/", 1)[0] for name in tracked}


def _section(title: str) -> str:
    """The text under the ``##`` heading containing ``title``, up to the next ``##`` heading."""
    match = re.search(rf"^## [^\n]*{re.escape(title)}[^\n]*\n(?P<body>.*?)(?=^## |\Z)", _map_text(), re.MULTILINE | re.DOTALL)
    assert match, f"docs/code-map.md has no '## ... {title}' section"
    return match.group("body")


def _exists(path: Path, token: str) -> bool:
    if "*" in token:
        return bool(glob.glob(str(path)))
    return path.exists()


def _repository_path(token: str, top_level: set[str]) -> str | None:
    """The path part of a backquoted token when it is a repository path, else None."""
    if _PLACEHOLDER.search(token) or token.startswith("/"):
        return None
    reference = _REFERENCE.match(token)
    path = reference.group("path") if reference else token
    if path in {".", "./"}:
        return "."
    return path if path.split("/", 1)[0] in top_level else None


def _directory_map() -> dict[str, str]:
    """Directory (no trailing slash, '.' for the root) -> the rest of its line."""
    entries: dict[str, str] = {}
    for line in _section("Directory map").splitlines():
        item = _MAP_ITEM.match(line)
        if item:
            entries[item.group("directory").rstrip("/") or "."] = item.group("rest")
    return entries


def _defined(tree: ast.Module, dotted: str) -> bool:
    """Whether ``dotted`` (``name``, ``Class.method``, ``outer.inner``) is defined in ``tree``."""
    body: list[ast.stmt] = tree.body
    parts = dotted.split(".")
    for position, part in enumerate(parts):
        found: ast.stmt | None = None
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == part:
                found = node
            elif position == 0 and len(parts) == 1 and isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(target, ast.Name) and target.id == part for target in targets):
                    found = node
        if found is None:
            return False
        if position < len(parts) - 1:
            if not isinstance(found, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                return False
            body = found.body
    return True


def test_backquoted_repository_paths_exist() -> None:
    top_level = _top_level()
    paths = {path for token in _TICKED.findall(_map_text()) if (path := _repository_path(token, top_level))}
    assert len(paths) > 50, f"only {len(paths)} repository paths found: has the map's format changed?"
    missing = sorted(path for path in paths if not _exists(ROOT / path, path))
    assert not missing, f"docs/code-map.md names paths that do not exist: {missing}"


def test_names_on_directory_map_lines_exist_in_their_directory() -> None:
    missing = []
    for directory, rest in _directory_map().items():
        for token in _TICKED.findall(rest):
            bare = token.rstrip("/")
            if _PLACEHOLDER.search(token) or "/" in bare or ":" in token:
                continue  # a repository path (checked above) or prose
            if not (token.endswith("/") or _FILE_NAME.match(token)):
                continue  # a command, a table, a setting: prose
            if not _exists(ROOT / directory / token, token):
                missing.append(f"{directory}/{token}")
    assert not missing, f"docs/code-map.md's directory map names files that are not there: {missing}"


def test_path_name_references_are_defined() -> None:
    references = [match for token in _TICKED.findall(_map_text()) if (match := _REFERENCE.match(token))]
    assert len(references) > 50, f"only {len(references)} path:name references found: has the map's format changed?"
    trees: dict[str, ast.Module] = {}
    wrong = []
    for reference in references:
        path, name = reference.group("path"), reference.group("name")
        file = ROOT / path
        if not file.is_file():
            wrong.append(f"{path}:{name} (no such file)")
            continue
        if path not in trees:
            trees[path] = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        if not _defined(trees[path], name):
            wrong.append(f"{path}:{name}")
    assert not wrong, f"docs/code-map.md names what those files do not define: {sorted(set(wrong))}"


def test_every_tracked_directory_is_in_the_directory_map() -> None:
    tracked = _tracked_files()
    if tracked is None:
        pytest.skip("no .git (not a checkout): the directory list comes from git's index")
    directories = {os.path.dirname(name) or "." for name in tracked}
    mapped = _directory_map()
    assert len(mapped) > 20, f"only {len(mapped)} directory lines found: has the map's format changed?"
    stale = sorted(directory for directory in COVERED_BY_PARENT if directory not in directories)
    assert not stale, f"COVERED_BY_PARENT names directories without tracked files, remove them: {stale}"
    for directory, parent in COVERED_BY_PARENT.items():
        assert parent in mapped, f"{directory} is covered by {parent}, which has no line in the map"
        parts = directory[len(parent) + 1 :].split("/")
        prefixes = ["/".join(parts[:length]) + "/" for length in range(1, len(parts) + 1)]
        assert any(f"`{prefix}`" in mapped[parent] for prefix in prefixes), (
            f"the map's line for {parent} does not name {prefixes[-1]} (or a folder above it) as covered"
        )
    missing = sorted(directories - set(mapped) - set(COVERED_BY_PARENT))
    assert not missing, f"directories with tracked files but no line in docs/code-map.md's directory map: {missing}"
