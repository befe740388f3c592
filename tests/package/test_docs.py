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


def test_the_cost_paragraph_reads_the_newest_runs():
    """The README states the median over the newest build's interleaved runs (argument_forms_speed/after_N.json,
    each a record of `bench overhead`); a later single run is kept beside the first (overhead_<commit>.json) and
    newest() finds it."""
    import json
    import statistics

    runs = [json.loads(p.read_text()) for p in (make_results.RECORDS / "h100").glob("overhead*.json")
            if not p.stem.endswith("_repeat")]
    assert make_results.newest("h100", "overhead") == max(runs, key=lambda r: r["environment"]["timestamp"])
    after = [json.loads(p.read_text())
             for p in sorted((make_results.RECORDS / "h100" / "argument_forms_speed").glob("after_*.json"))]
    assert after

    def median(key: str) -> float:
        return statistics.median(x["metrics"]["median_us"] for r in after for x in r["records"]
                                 if x["variant"] == key and x["verified"])

    line = make_results.readme_cost()
    assert (f"a lean scope **{median('persist_lean'):.1f} us**" in line
            and f"on a 32-node graph {median('persist_graph_32'):.1f} us" in line)
    assert line in (ROOT / "README.md").read_text()


def test_every_generated_table_has_its_records():
    for path in make_results.DOCS:
        for name in re.findall(r"<!-- generated:([\w-]+) -->", path.read_text()):
            assert make_results.GENERATORS[name]().strip(), f"{path.name}: no records behind the table {name}"



def test_a_pending_table_waits_for_its_record_and_then_is_generated(tmp_path, monkeypatch):
    """``<!-- pending:NAME -->`` stays while its generator gives nothing and becomes a generated table once the record
    is there; the tuner-grid table, from a record scripts/bench_tuner_grid.py wrote on the simulator."""
    import subprocess

    text = "before\n<!-- pending:tuner-grid-h200 -->\nafter\n"
    monkeypatch.setattr(make_results, "RECORDS", tmp_path)
    assert make_results.render(text) == text
    record = tmp_path / "h200" / "tuner_grid.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tuner_grid.py"), "--quick", "--sizes", "4,8",
                           "--json", str(record)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = make_results.tuner_grid("h200")
    assert table.startswith("| LUT | runs within 3% |") and "| 4 MiB | " in table and "| 8 MiB | " in table
    assert "(simulated)" in table  # the device's name: a simulated record never passes for a measured one
    rendered = make_results.render(text)
    assert rendered == f"before\n<!-- generated:tuner-grid-h200 -->\n{table}\n<!-- end:tuner-grid-h200 -->\nafter\n"
    assert make_results.render(rendered) == rendered

def test_links_between_the_documents_resolve():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(((?!https?:)[^)#]+)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_the_command_lists_name_every_command():
    from l2ctl import cli
    from l2ctl.cli.parsing import Group

    names = [name for entry in cli.COMMANDS for name in [entry.name] + (
        [c.name for c in entry.commands if c is not entry.default] if isinstance(entry, Group) else [])]
    for path in (ROOT / "README.md", ROOT / "docs" / "reference.md"):
        section = path.read_text().split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
        missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", section)]
        assert not missing, f"{path.name}'s command line section does not name {missing}"


def test_the_readme_is_a_five_minute_read():
    words = len((ROOT / "README.md").read_text().split())
    assert words < 1600, f"README.md has {words} words; move details to docs/"


# The README's numbers outside the generated blocks and the code: each is a constant of the code or of a
# requirement, not a measurement (measurements are generated from the records above). A new number in the
# prose fails here until it is generated or listed with where it comes from.
README_CONSTANTS = {
    "3.10": "requires-python", "525.60.13": "the CUDA 12 build's driver (test_the_readmes_constants_hold)",
    "580.65.06": "the CUDA 13 build's driver (test_the_readmes_constants_hold)", "8.0": "the oldest compute capability",
    "2.9": "torch's first keep_graph release", "2%": "tune's tax_gain default", "95%": "tune's confidence default",
    "05": "a notebook's number", "01": "a notebook's number", "03": "a notebook's number", "04": "a notebook's number",
    "1-5": "a step's duration, for scale", "1.5G": "a size, as the CLI takes it", "8M": "a size, as the CLI takes it",
    "4M,16M": "a size list, as the CLI takes it", "16": "the Quick start's bias, MiB", "1": "one GiB streaming past",
    "32": "the graph example's accumulator, MiB", "4": "the controls example's LUT, MiB", "75%": "the textbook recipe",
}


def _prose(text: str) -> str:
    text = re.sub(r"<!-- generated:([\w-]+) -->.*?<!-- end:\1 -->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))


def test_the_readmes_numbers_come_from_records_or_constants():
    prose = _prose((ROOT / "README.md").read_text())
    found = set(re.findall(r"(?<![\w.`-])(\d[\d.,-]*\d%?|\d%?)( ?(?:x|us|ms|MiB|GiB|GB/s|s)\b)?", prose))
    # bare one- or two-digit counts ("two GPUs" written as digits, "step 3") are not claims; a number with a
    # unit or a ratio, or with a fraction, is
    stray = {n + u.strip() for n, u in found if n not in README_CONSTANTS and (u or not re.fullmatch(r"\d\d?", n))}
    assert not stray, f"numbers in README.md that no record or constant backs: {sorted(stray)}"


def test_the_readmes_constants_hold():
    import inspect

    import l2ctl

    text = " ".join((ROOT / "README.md").read_text().split())
    tune = inspect.signature(l2ctl.tune).parameters
    assert f"{tune['tax_gain'].default:.0%}" == "2%" and f"{tune['confidence'].default:.0%}" == "95%"
    assert 'requires-python = ">=3.10"' in (ROOT / "pyproject.toml").read_text()
    # the Install table: one line per driver, the oldest each CUDA major needs, and the extra of that major
    for major in (12, 13):
        row = f"| driver {l2ctl.minimum_driver(major * 1000)} or newer (CUDA {major}) | `pip install -v \".[cu{major}]\"` |"
        assert row in text, row
    assert f"every driver since {l2ctl.minimum_driver(12000)}: it links CUDA 12's runtime" in text
