"""Check that a release is what it says: the version in `s2_spark/_version.py`, the newest
section of CHANGELOG.md and, for a tag, the tag and the section's date agree.

    python scripts/check_release.py            # before a release: the changelog has a
                                               # section for this version, newest first
    python scripts/check_release.py v0.2.0     # a tag (the wheels workflow, before it
                                               # publishes): tag = version, section dated

Exits 1 naming what disagrees. Reads the files; imports nothing from the package.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2}|Unreleased)$",
                     re.MULTILINE)


def package_version(root: Path = ROOT) -> str:
    """`__version__` as `s2_spark/_version.py` assigns it."""
    tree = ast.parse((root / "s2_spark" / "_version.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__version__"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise ValueError("s2_spark/_version.py assigns no __version__ string")


def problems(tag: str | None, root: Path = ROOT) -> list[str]:
    """What disagrees (nothing: an empty list)."""
    version = package_version(root)
    sections = SECTION.findall((root / "CHANGELOG.md").read_text())
    if not sections:
        return ["CHANGELOG.md has no section headed '## [X.Y.Z] - YYYY-MM-DD' (or - Unreleased)"]
    newest, date = sections[0]
    found = []
    if newest != version:
        found.append(f"the newest section of CHANGELOG.md is {newest}, the package's version "
                     f"is {version} (s2_spark/_version.py)")
    if tag is not None:
        if tag != f"v{version}":
            found.append(f"the tag is {tag}, the package's version is {version}: tag v{version}")
        if date == "Unreleased":
            found.append(f"CHANGELOG.md's section for {newest} has no date: head it "
                         f"'## [{newest}] - YYYY-MM-DD' before tagging")
    return found


def main(argv: list[str]) -> int:
    found = problems(argv[0] if argv else None)
    for problem in found:
        print(f"check_release: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
