"""The part of requirements.lock an image installs, with the lock's hashes (run in an image's
builder stage; standard library only, as the base image has nothing else).

The suite runs against requirements.lock; an image whose ``pip wheel`` resolved its
dependencies afresh installed other versions of 6 of them (issue 37).  So the builder
resolves with the lock as constraints (``constraints``), keeps pip's resolution report, and
this script turns the report into the lock's own entries -- versions and sha256 hashes -- for
exactly the packages resolved (``subset``); the image then downloads and installs them with
``pip --require-hashes``.  A resolved package the lock does not have, or has at another
version, is an error: the lock is stale (``make lock``), not the image.

    python3 lock_subset.py constraints requirements.lock > constraints.txt
    python3 lock_subset.py subset requirements.lock report.json > runtime.lock
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: ``name==version \`` opening an entry; its ``--hash`` lines and ``# via`` comments follow.
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def canonical(name: str) -> str:
    """PEP 503's normalized name (``Foo.Bar_baz`` and ``foo-bar-baz`` are one package)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, tuple[str, str]]:
    """Canonical name -> (version, the entry's text with its hash lines, comments dropped)."""
    entries: dict[str, tuple[str, str]] = {}
    current: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _ENTRY.match(line)
        if match:
            current = canonical(match.group(1))
            entries[current] = (match.group(2), line)
        elif current is not None and line.lstrip().startswith("--hash="):
            version, text = entries[current]
            entries[current] = (version, f"{text}\n{line}")
        elif not line.startswith(" "):
            current = None
    return entries


def constraints(lock: Path) -> str:
    """The lock as a constraints file (pip refuses hashes there)."""
    return "".join(f"{name}=={version}\n" for name, (version, _) in sorted(read_lock(lock).items()))


def subset(lock: Path, report: Path) -> str:
    """The lock's entries of every package pip's report installs but the local files (the
    project's own wheels, given as paths); raises ``SystemExit`` on a package the lock lacks
    or pins otherwise."""
    entries = read_lock(lock)
    chosen: list[str] = []
    errors: list[str] = []
    for item in json.loads(report.read_text(encoding="utf-8"))["install"]:
        if item.get("download_info", {}).get("url", "").startswith("file:"):
            continue  # the project's own distributions, built in this stage
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        locked = entries.get(name)
        if locked is None:
            errors.append(f"{name}=={version} is not in requirements.lock")
        elif locked[0] != version:
            errors.append(f"{name} resolved to {version}, requirements.lock pins {locked[0]}")
        else:
            chosen.append(locked[1])
    if errors:
        raise SystemExit("lock_subset: the lock does not cover the image (run `make lock`):\n  " + "\n  ".join(errors))
    return "".join(f"{entry}\n" for entry in sorted(chosen))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "constraints":
        sys.stdout.write(constraints(Path(argv[2])))
        return 0
    if len(argv) == 4 and argv[1] == "subset":
        sys.stdout.write(subset(Path(argv[2]), Path(argv[3])))
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
