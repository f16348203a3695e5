"""The project's code and pages send the reader only to files inside the repository.

No file under stare_lab/, docs/, benchmarks/, scripts/, .ci/, README.md, pyproject.toml or the
Makefile names a document that is not part of the project (DESIGN.md, STYLE.md, METHODS.md,
ENVIRONMENT.md) or the folder they live in; the design document is docs/design.md, and every place
that cites one of its sections names a section it has.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("stare_lab", "docs", "benchmarks", "scripts", "README.md", "pyproject.toml", "Makefile", ".ci")
OUTSIDE = ("DESIGN.md", "STYLE.md", "METHODS.md", "ENVIRONMENT.md", "../shared", "/work/shared")
DESIGN = ROOT / "docs" / "design.md"
SECTIONS = (
    "Layers",
    "One training step",
    "Statistics",
    "The loss",
    "Seeds",
    "One sweep",
    "Command line",
    "The run record",
)


def text_files(tree: str) -> list[Path]:
    """The text files of `tree` (a folder or one file), bytecode and binary files left out."""
    top = ROOT / tree
    paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
    out = []
    for path in paths:
        if "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # weights, images
            continue
        out.append(path)
    return out


def mentions(path: Path, needles: tuple[str, ...], root: Path = ROOT) -> list[str]:
    """`path:line: needle` (path relative to `root`) for every line of `path` that contains one of
    `needles`, case as written."""
    found = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for needle in needles:
            if needle in line:
                found.append(f"{path.relative_to(root)}:{i}: {needle}")
    return found


def test_mentions_finds_what_it_should(tmp_path):
    """The scan itself: a hit names file and line; docs/design.md is not DESIGN.md."""
    f = tmp_path / "probe.py"
    f.write_text('"""See docs/design.md, "Seeds".\n\nAs in DESIGN.md §3 and ../shared/STYLE.md."""\n')
    assert mentions(f, OUTSIDE, root=tmp_path) == [
        "probe.py:3: DESIGN.md",
        "probe.py:3: STYLE.md",
        "probe.py:3: ../shared",
    ]


@pytest.mark.parametrize("tree", TREES)
def test_no_document_outside_the_repository(tree):
    files = text_files(tree)
    assert files, f"nothing to scan under {tree}"
    found = [hit for path in files for hit in mentions(path, OUTSIDE)]
    assert found == [], "names a document outside the repository:\n" + "\n".join(found)


def test_design_has_its_sections():
    """Its sections, in this order (others may come between them)."""
    headings = re.findall(r"^## (.+)$", DESIGN.read_text(), flags=re.M)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)


def test_design_sections_cited_exist():
    """Every `docs/design.md, "<section>"` in the code and pages names one of its headings (## to ####)."""
    headings = set(re.findall(r"^#{2,4} (.+)$", DESIGN.read_text(), flags=re.M))
    cited = re.compile(r'docs/design\.md,\s*"([^"]+)"')
    found = {}
    for tree in TREES:
        for path in text_files(tree):
            for name in cited.findall(path.read_text(errors="replace")):
                found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert found, "no file cites a section of docs/design.md"
    unknown = {name: where for name, where in found.items() if name not in headings}
    assert unknown == {}


def test_design_links_exist():
    """The docs pages docs/design.md sends the reader to, and the tests it names, are there."""
    text = DESIGN.read_text()
    linked = set(re.findall(r"\b(docs/[\w./-]+\.md)\b", text)) | set(re.findall(r"\b(tests/[\w./-]+)", text))
    assert "docs/run_record.md" in linked
    missing = sorted(p for p in linked if not (ROOT / p.rstrip("/.")).exists())
    assert missing == []


def test_every_test_file_named_exists():
    """A `tests/...py` path named in the code, the pages or the benchmarks is a file of the repository
    (tests/ mirrors the package: a moved test must not leave its old path behind)."""
    named = re.compile(r"\b(tests/[\w./-]+\.py)\b")
    other_projects = {  # test files of the codes we compare with, named as theirs
        "tests/test_grpo_trainer.py",  # TRL's
        "tests/trainer/ppo/test_kl_cov_mask_on_cpu.py",  # verl's
    }
    missing = []
    for tree in TREES:
        for path in text_files(tree):
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                gone = [p for p in named.findall(line) if p not in other_projects and not (ROOT / p).is_file()]
                missing += [f"{path.relative_to(ROOT)}:{i}: {p}" for p in gone]
    assert missing == [], "names a test file that is not there:\n" + "\n".join(missing)
