"""The documentation site builds with `mkdocs build --strict` (every warning an error: a broken
link, a missing anchor, a page outside the nav, a docstring mkdocstrings cannot render), and
mkdocs.yml's validation settings make broken links and anchors fatal."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
pytest.importorskip("mkdocstrings_handlers.python",
                    reason="mkdocstrings[python] is not installed: pip install -e '.[docs]'")
yaml = pytest.importorskip("yaml")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly(tmp_path):
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    api = (tmp_path / "site" / "reference" / "fedmc" / "index.html").read_text()
    assert "client_prototypes" in api and "local_geometry" in api  # the docstrings were rendered


@pytest.mark.parametrize("link, message", [
    ("[gone](no-such-page.md)", "no-such-page.md"),
    ("[gone](#no-such-anchor)", "no-such-anchor"),
])
def test_a_broken_link_fails_the_build(tmp_path, link, message):
    """The project's own validation settings on a one-page site with one bad link."""
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\nSee {link}.\n")
    small = {"site_name": "t", "docs_dir": str(docs), "strict": cfg["strict"],
             "validation": cfg["validation"], "markdown_extensions": ["toc", "attr_list"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-3000:]
