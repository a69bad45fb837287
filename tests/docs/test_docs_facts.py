"""The docs' facts that grow with the code stay true: each lives in one document and equals the code.

``scripts/docs-facts.py`` generates each fact -- the wire versions, the migrations, the dashboard
pages, the collector's settings, the ``iwscope`` and ``iwprobe`` commands -- from the code; the
documents hold them between ``<!-- facts:NAME ... -->`` and ``<!-- /facts:NAME -->``.  When one
of these tests fails, ``.venv/bin/python scripts/docs-facts.py --write`` rewrites the blocks
(then read the diff: a new migration or page may deserve a sentence of prose too).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType

import pytest
from test_import_graph import PACKAGES, modules_of  # tests/ is on sys.path (rootdir conftest.py)

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_facts", REPO / "scripts" / "docs-facts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


facts = _load_script()
FIX = f"fix: {facts.WRITE_COMMAND}"


def _relative(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO))


@pytest.fixture(scope="module")
def locations() -> dict[str, list[pathlib.Path]]:
    return facts.locations()


@pytest.mark.parametrize("name", sorted(facts.FACTS))
def test_each_fact_lives_in_exactly_one_document(name: str, locations: dict[str, list[pathlib.Path]]) -> None:
    held = [_relative(path) for path in locations[name]]
    assert len(held) == 1, (
        f"<!-- facts:{name} --> ... <!-- /facts:{name} --> must be in exactly one document, found in {held or 'none'}: "
        "keep it in one and link to it from the others"
    )


def test_no_document_holds_an_unknown_fact(locations: dict[str, list[pathlib.Path]]) -> None:
    unknown = {name: [_relative(path) for path in paths] for name, paths in locations.items() if name not in facts.FACTS}
    assert not unknown, f"blocks of facts scripts/docs-facts.py does not know: {unknown}"


@pytest.mark.parametrize("name", sorted(facts.FACTS))
def test_fact_block_equals_the_code(name: str, locations: dict[str, list[pathlib.Path]]) -> None:
    if len(locations[name]) != 1:
        pytest.skip("not in exactly one document (the test above fails)")
    path = locations[name][0]
    text = path.read_text(encoding="utf-8")
    start, end = next((start, end) for found, start, end in facts.blocks(text) if found == name)
    current, expected = text[start:end], facts.render(name)
    assert current == expected, f"the docs' fact {name!r} in {_relative(path)} drifted from the code; {FIX}\n" + facts.diff(
        path, current + "\n", expected + "\n"
    )


def _outside_blocks(text: str) -> str:
    pieces, position = [], 0
    for _name, start, end in facts.blocks(text):
        pieces.append(text[position:start])
        position = end
    return "".join(pieces) + text[position:]


def test_the_wire_version_is_stated_only_in_its_block() -> None:
    stated = [
        f"{_relative(path)}: {match.group(0)}"
        for path in facts.documents()
        for match in re.finditer(r"WIRE_VERSION\s*=\s*\d+", _outside_blocks(path.read_text(encoding="utf-8")))
    ]
    assert not stated, f"the current wire version is stated outside <!-- facts:wire -->; link to it instead: {stated}"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    following = text.find("\n## ", start + len(heading) + 2)
    return text[start : following if following >= 0 else len(text)]


def _table_first_cells(section: str) -> list[str]:
    """The first cell of every table row of ``section`` but header and rule rows."""
    cells = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    return [cell for cell in cells if cell and not set(cell) <= {"-"} and cell not in ("path", "package")]


def test_every_page_of_the_navigation_bar_is_described() -> None:
    """docs/dashboard.md "Pages": the table of what each page shows has one row per navigation entry."""
    navigation = {path for path, page in facts.pages().items() if page["navigation"] is not None}
    section = _outside_blocks(_section((REPO / "docs" / "dashboard.md").read_text(encoding="utf-8"), "## Pages"))
    described = {cell.split("`")[1] for cell in _table_first_cells(section) if cell.startswith("`")}
    assert navigation == described, (
        f"docs/dashboard.md 'Pages': pages without a description: {sorted(navigation - described)}; "
        f"described but not in the navigation bar: {sorted(described - navigation)}"
    )


def test_the_collector_layout_names_every_top_level_module() -> None:
    """collector/README.md "Layout" names each module and package directly under ``iwscope/``."""
    # Dotted names "iwscope.x": a module x.py or a package x/ (its __init__.py) right under iwscope/.
    modules = {name.split(".")[1] for name in modules_of({"iwscope": PACKAGES["iwscope"]}) if name.count(".") == 1}
    section = _section((REPO / "collector" / "README.md").read_text(encoding="utf-8"), "## Layout")
    named = {
        name.removeprefix("iwscope/").rstrip("/").removesuffix(".py")
        for cell in _table_first_cells(section)
        for name in re.findall(r"`([^`]+)`", cell)
    }
    assert modules <= named, f"collector/README.md 'Layout' does not name {sorted(modules - named)}"


def test_the_probe_package_docstring_names_everything_it_exports() -> None:
    """``iwprobe.__doc__`` is the probe's public surface in words: every name of ``__all__`` is in it."""
    import iwprobe

    doc = iwprobe.__doc__ or ""
    missing = [
        name for name in iwprobe.__all__ if not name.startswith("__") and not re.search(rf"`(iwprobe\.)?{re.escape(name)}`", doc)
    ]
    assert not missing, f"probe/src/iwprobe/__init__.py: the docstring does not name {missing}, which __all__ exports"
