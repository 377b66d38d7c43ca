"""The documentation site builds from docs/ with no broken link or anchor, and nav lists every page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    # strict: every warning fails the build, and mkdocs.yml turns a link to a missing page or anchor, and a page
    # missing from the nav, into warnings.
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "settings" / "index.html").is_file()


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for needed in ("make run", "make test", "Prerequisites", "<!-- walkthrough: first-webhook -->"):
        assert needed in readme, needed


def test_no_page_cites_a_document_a_reader_does_not_have() -> None:
    # The specifications and issues behind the project are not shipped: the pages stand on their own.
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for page in pages:
        text = page.read_text()
        for private in ("SPEC-0", "ADR-0", "issue 1", "issue 2", "issue 3"):
            assert private not in text, f"{page.relative_to(ROOT)} cites {private}…"
