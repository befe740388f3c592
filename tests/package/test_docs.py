"""The documents agree with the records: every table generated from benchmarks/results/ (README.md,
docs/results.md) is what its records give today, and the links between the documents resolve."""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import make_results  # noqa: E402


def test_generated_tables_match_the_records():
    for path in make_results.DOCS:
        text = path.read_text()
        assert "<!-- generated:" in text, f"{path.name} has no generated table"
        assert make_results.render(text) == text, (f"{path.name} is out of date with benchmarks/results/: run "
                                                   "python scripts/make_results.py")


def test_every_generated_table_has_its_records():
    for path in make_results.DOCS:
        for name in re.findall(r"<!-- generated:([\w-]+) -->", path.read_text()):
            assert make_results.GENERATORS[name]().strip(), f"{path.name}: no records behind the table {name}"


def test_links_between_the_documents_resolve():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(((?!https?:)[^)#]+)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_the_readme_is_a_five_minute_read():
    words = len((ROOT / "README.md").read_text().split())
    assert words < 1600, f"README.md has {words} words; move details to docs/"
