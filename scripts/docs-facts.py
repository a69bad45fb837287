"""The docs' facts that grow with the code, generated from the code.

Each fact lives in exactly one document, between two marker comments::

    <!-- facts:migrations ... -->
    (generated text)
    <!-- /facts:migrations -->

``tests/docs/test_docs_facts.py`` regenerates every block and fails when a document differs;
this script rewrites them::

    .venv/bin/python scripts/docs-facts.py --write   # rewrite the blocks from the code
    .venv/bin/python scripts/docs-facts.py           # only check: a diff and exit 1 on drift

The facts: ``wire`` (``WIRE_VERSION`` and the versions the collector accepts), ``migrations``
(``migrations/versions/``), ``dashboard-pages`` (``dash.register_page`` of every page module and
the navigation bar), ``settings`` (the collector's ``Settings``: environment variables,
defaults, bounds, the ``#:`` comment of each field) and ``cli`` (the ``iwscope`` and ``iwprobe``
commands with the first sentence of their help).  Run with the checkout's ``.venv``: the
``iwscope`` tree includes the commands the lab and the dashboard register through entry points.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import pathlib
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = "scripts/docs-facts.py"
WRITE_COMMAND = f".venv/bin/python {SCRIPT} --write"

START = re.compile(r"<!-- facts:(?P<name>[a-z][a-z0-9-]*)\b[^>]*-->\n")
#: Where blocks may be: README.md, and the Markdown files under docs/, the four packages' folders,
#: migrations/, helm/, bench/ and examples/ (not tests/, scripts/, docker/, artifacts/ or .venv/).
DOC_ROOTS = ("README.md", "docs", "probe", "collector", "dashboard", "lab", "migrations", "helm", "bench", "examples")


# ---- text helpers -------------------------------------------------------------------------------


def _markdown(text: str) -> str:
    """reST inline markup of a docstring or comment as Markdown, safe inside a table cell."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"``\1``", text)  # :mod:`x` -> ``x``
    text = text.replace("``", "`")
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans: no HTML, no table breaks
        parts[i] = parts[i].replace("<", r"\<").replace(">", r"\>").replace("*", r"\*")
    return "`".join(parts).replace("|", r"\|")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"\.(?=\s+[A-Z(`]|$)", text)
    return text[: match.end()] if match else text


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ---- the facts ----------------------------------------------------------------------------------


def wire() -> str:
    """``WIRE_VERSION`` and the versions the collector's models accept."""
    from iwprobe import wire as wire_module
    from iwscope.wiretypes import WireVersion

    accepted = typing.get_args(WireVersion)
    return (
        f"- current version: `WIRE_VERSION = {wire_module.WIRE_VERSION}` (`probe/src/iwprobe/wire.py`; "
        "its comment holds the history of every version);\n"
        f"- the collector accepts envelopes of versions {', '.join(str(v) for v in accepted)} "
        "(`iwscope.wiretypes.WireVersion`, from `wire.ACCEPTED_WIRE_VERSIONS`); any other `wire_version` is a 422."
    )


def migrations() -> str:
    """Every Alembic revision, in upgrade order, with the first paragraph of its docstring."""
    from alembic.script import ScriptDirectory

    from iwscope.migrate import alembic_config

    scripts = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    if len(scripts.get_bases()) != 1 or len(scripts.get_heads()) != 1:
        raise ValueError("migrations/versions/ is not one chain from the base (several bases or heads)")
    rows: list[tuple[str, ...]] = []
    for script in reversed(list(scripts.walk_revisions())):
        # Alembic's doc: the docstring's first paragraph (with "Revision ID: ..." when no blank line precedes it).
        summary = script.doc.split("Revision ID:")[0]
        rows.append((f"`{script.revision}`", _markdown(_first_sentence(summary))))
    return _table(("revision", "what it adds"), rows)


def _register_page(path: pathlib.Path) -> dict[str, Any] | None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_page"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "dash"
        ):
            keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
            for required in ("path", "name"):
                if required not in keywords:
                    raise ValueError(f"{path}: dash.register_page needs a literal {required}= for the docs")
            page = {name: ast.literal_eval(value) for name, value in keywords.items() if name in ("path", "name", "order")}
            page["module"] = path.stem
            return page
    return None


def pages() -> dict[str, dict[str, Any]]:
    """The registered pages (``dash.register_page``) by path, in their order: ``name``, ``module``,
    ``order`` when given, and ``navigation``: None when the navigation bar leaves the page out,
    else whether its link keeps the filters."""
    package = REPO / "dashboard" / "src" / "iwscope_dashboard"
    found = [page for path in sorted((package / "pages").glob("*.py")) if (page := _register_page(path))]
    found.sort(key=lambda page: (page.get("order") is None, page.get("order") or 0, page["module"]))
    navigation: dict[str, bool] = {}
    for node in ast.parse((package / "app.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(target, ast.Name) and target.id == "NAVIGATION" for target in targets) and node.value:
                navigation = {path: keep for path, _label, keep in ast.literal_eval(node.value)}
    if not navigation:
        raise ValueError("iwscope_dashboard/app.py: no literal NAVIGATION")
    return {
        page["path"]: {**{key: value for key, value in page.items() if key != "path"}, "navigation": navigation.get(page["path"])}
        for page in found
    }


def dashboard_pages() -> str:
    """The registered pages (``dash.register_page``) in their order, and the navigation bar."""
    rows = []
    for path, page in pages().items():
        keeps_filters = page["navigation"]
        bar = "no" if keeps_filters is None else "yes, keeps the filters" if keeps_filters else "yes"
        rows.append((f"`{path}`", _markdown(page["name"]), f"`pages/{page['module']}.py`", bar))
    return _table(("path", "name", "module", "in the navigation bar"), rows)


def _field_comments(source: str, class_name: str) -> dict[str, str]:
    """The ``#:`` comment lines right above each annotated field of ``class_name``."""
    comments: dict[str, str] = {}
    lines = source.splitlines()
    cls = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == class_name)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above: list[str] = []
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                above.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            comments[node.target.id] = " ".join(above)
    return comments


def _kind(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{value}`" for value in typing.get_args(annotation))
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    kinds = {str: "text", int: "integer", float: "number", bool: "boolean", pathlib.Path: "directory"}
    if annotation not in kinds:
        raise ValueError(f"iwscope.config.Settings: no word for the type {annotation!r}: add it to _kind")
    return kinds[annotation]


def _bounds(metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        for attribute, sign in (("min_length", "length >="), ("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attribute, None)
            if value is not None:
                words.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(words)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def settings() -> str:
    """The collector's ``Settings``: one row per field, from the class itself and its comments."""
    from pydantic import AliasChoices

    from iwscope import config

    comments = _field_comments(pathlib.Path(config.__file__).read_text(encoding="utf-8"), "Settings")
    rows = []
    for name, field in config.Settings.model_fields.items():
        alias = field.validation_alias
        variables = alias.choices if isinstance(alias, AliasChoices) else [alias or name.upper()]
        if not comments.get(name):
            raise ValueError(f"iwscope/config.py: Settings.{name} has no `#:` comment to document it with")
        rows.append(
            (
                " or ".join(f"`{variable}`" for variable in variables),
                _default(field.default),
                _kind(field.annotation),
                _bounds(field.metadata),
                _markdown(_first_sentence(comments[name])),
            )
        )
    model_config = config.Settings.model_config
    prefix = model_config.get("env_prefix") or ""
    note = f"Environment prefix: `{prefix}`." if prefix else "No environment prefix: each field names its variable."
    note += " Names are case-sensitive." if model_config.get("case_sensitive") else " Names are not case-sensitive."
    return note + "\n\n" + _table(("variable", "default", "type", "allowed", "what"), rows)


def _click_rows(command: Any, prefix: str) -> Iterator[tuple[str, ...]]:
    import click

    context = click.Context(command)
    for name in command.list_commands(context):
        sub = command.get_command(context, name)
        if sub is None or sub.hidden:
            continue
        yield (f"`{prefix} {name}`", _markdown(sub.get_short_help_str(limit=1000)))
        if isinstance(sub, click.Group):
            yield from _click_rows(sub, f"{prefix} {name}")


def _iwprobe_rows() -> Iterator[tuple[str, ...]]:
    from iwprobe.__main__ import _parser

    for action in _parser()._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, parser in action.choices.items():
            text = helps.get(name, "")
            positional = next((a for a in parser._actions if a.dest == "action" and a.choices), None)
            command = f"iwprobe {name}"
            if positional is not None:
                optional = positional.nargs == "?"
                command += " [ACTION]" if optional else " ACTION"
                choices = ", ".join(
                    f"`{choice}`" + (" (default)" if choice == positional.default else "") for choice in positional.choices
                )
                text += f"; ACTION: {choices}"
            yield (f"`{command}`", _markdown(text))


def _plugin_commands() -> str:
    """The ``iwscope.commands`` entry points (the lab's and the dashboard's commands) as words."""
    import importlib.metadata

    names = sorted(f"`{point.name}`" for point in importlib.metadata.entry_points(group="iwscope.commands"))
    if not names:
        raise ValueError("no iwscope.commands entry points: run make setup (the editable lab and dashboard)")
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def cli() -> str:
    """``iwscope`` (click, with the commands the lab and the dashboard register) and ``iwprobe`` (argparse)."""
    from iwscope.cli import main

    return (
        f"`iwscope` (collector; {_plugin_commands()} come from their distributions through the "
        "`iwscope.commands` entry points):\n\n"
        + _table(("command", "what"), list(_click_rows(main, "iwscope")))
        + "\n\n`iwprobe` (the agent, `probe/`):\n\n"
        + _table(("command", "what"), list(_iwprobe_rows()))
    )


#: Every fact: its generator and, for the marker comment, where it is generated from.
FACTS: dict[str, tuple[Callable[[], str], str]] = {
    "wire": (wire, "probe/src/iwprobe/wire.py and iwscope.wiretypes"),
    "migrations": (migrations, "migrations/versions/"),
    "dashboard-pages": (dashboard_pages, "the register_page calls of dashboard pages/ and app.NAVIGATION"),
    "settings": (settings, "iwscope.config.Settings"),
    "cli": (cli, "the iwscope (click) and iwprobe (argparse) command definitions"),
}


# ---- blocks in the documents --------------------------------------------------------------------


def documents() -> list[pathlib.Path]:
    """Every Markdown file that may hold a block."""
    found: list[pathlib.Path] = []
    for root in DOC_ROOTS:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(path.rglob("*.md"))
        found += [
            candidate
            for candidate in candidates
            if not any(part.startswith(".") or part.endswith(".egg-info") for part in candidate.relative_to(REPO).parts)
        ]
    return found


def start_marker(name: str) -> str:
    return f"<!-- facts:{name} (generated from {FACTS[name][1]} by {WRITE_COMMAND}; edit the code, not this block) -->\n"


def blocks(text: str) -> Iterator[tuple[str, int, int]]:
    """``(name, start, end)`` of every block in ``text``: the span from the start marker to the end marker."""
    for match in START.finditer(text):
        name = match["name"]
        end_marker = f"<!-- /facts:{name} -->"
        end = text.find(end_marker, match.end())
        if end < 0:
            raise ValueError(f"<!-- facts:{name} --> has no {end_marker}")
        yield name, match.start(), end + len(end_marker)


def render(name: str) -> str:
    """The whole block of ``name``, markers included."""
    return f"{start_marker(name)}{FACTS[name][0]().rstrip()}\n<!-- /facts:{name} -->"


def locations() -> dict[str, list[pathlib.Path]]:
    """Which documents hold a block of each fact (each should be held by exactly one)."""
    where: dict[str, list[pathlib.Path]] = {name: [] for name in FACTS}
    for path in documents():
        for name, _start, _end in blocks(path.read_text(encoding="utf-8")):
            where.setdefault(name, []).append(path)
    return where


def rewrite(path: pathlib.Path, rendered: dict[str, str] | None = None) -> tuple[str, str]:
    """``(current text, text with every block regenerated)`` of one document."""
    rendered = {} if rendered is None else rendered
    text = path.read_text(encoding="utf-8")
    pieces: list[str] = []
    position = 0
    for name, start, end in blocks(text):
        if name not in FACTS:
            raise ValueError(f"{path.relative_to(REPO)}: unknown fact {name!r} (known: {', '.join(FACTS)})")
        if name not in rendered:
            rendered[name] = render(name)
        pieces += [text[position:start], rendered[name]]
        position = end
    pieces.append(text[position:])
    return text, "".join(pieces)


def diff(path: pathlib.Path, old: str, new: str) -> str:
    relative = str(path.relative_to(REPO))
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"{relative} (now)", f"{relative} (from the code)"
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks (default: only check)")
    args = parser.parse_args(argv)
    problems: list[str] = []
    for name, paths in locations().items():
        if len(paths) != 1:
            held = ", ".join(str(path.relative_to(REPO)) for path in paths) or "no document"
            problems.append(f"fact {name!r} must be in exactly one document, found in {held}")
    rendered: dict[str, str] = {}
    for path in documents():
        old, new = rewrite(path, rendered)
        if old == new:
            continue
        if args.write:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {path.relative_to(REPO)}")
        else:
            problems.append(diff(path, old, new))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems and not args.write:
        print(f"the docs' facts drifted from the code: run {WRITE_COMMAND}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
