"""The README and docs/ as a newcomer meets them on a fresh clone: every relative link and image resolves (its
anchor too), every script the README runs exists, and the extra the README names installs Notebook 7."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(path: Path) -> str:
    """The file without its fenced code blocks (a `[x](y)` in code is not a link)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the file's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_images_resolve(doc):
    broken = []
    for target in LINK.findall(prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor in {path.relative_to(REPO)}")
    assert broken == [], broken


def test_the_readme_is_a_short_front_page_with_its_commands_and_a_screenshot():
    readme = (REPO / "README.md").read_text()
    assert len(readme) < 8000, "a front page: move long sections into docs/ and link them"
    for script in set(re.findall(r"\bscripts/[\w.]+", readme)):
        path = REPO / script
        assert path.is_file(), script
        assert not script.endswith(".sh") or os.access(path, os.X_OK), f"{script} is not executable"
    assert "scripts/quickstart.sh --port" in readme  # tests/e2e/test_hardening.py runs it with --port
    assert re.search(r"!\[[^\]]+\]\(docs/images/[\w-]+\.png\)", readme)
    for guide in ("docs/user-guide.md", "docs/operator-guide.md", "docs/ray.md", "docs/ARCHITECTURE.md"):
        assert f"]({guide}" in readme, guide


def test_the_extra_the_readme_names_installs_notebook_7():
    readme = (REPO / "README.md").read_text()
    (extra,) = set(re.findall(r"pip install -e '\.\[(\w+)\]'", readme))
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"notebook>=7", dep) for dep in extras[extra]), extras[extra]
    assert f". scripts/install_venv.sh {extra}" in (REPO / "scripts/quickstart.sh").read_text()
    assert "Notebook 7" in readme


def test_every_image_in_the_docs_is_one_the_image_script_makes():
    script = (REPO / "scripts/make_images.py").read_text()
    shown = {Path(t).name for doc in DOCS for t in LINK.findall(prose(doc)) if t.endswith(".png")}
    assert shown and all(f'"{name}"' in script for name in shown), shown
