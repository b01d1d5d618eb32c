"""Every measured figure the README and the documentation quote is in the results file they link.

A page quotes a figure (a decimal such as 0.92, or a count of times, microseconds, bytes:
`8.7×`, `25 µs`) in a paragraph, list item or table. The results files it may come from are
the `results/*.md` (or `.log`) links of that block or, for a table without links, of the
paragraph that introduced it in the same section. A block with no results file quotes no
figure: a bare decimal there counts as one only where the block speaks of measuring. The
figure must appear in one of those files, at the page's precision (`0.9` matches a file's
`0.90` or `0.904`), or the block derives it from figures that do:
`<!-- derived: 8.7 = 411054 / 47409 -->`. Code, link targets, versions (`JAX 0.10.2`),
settings (`γ = 0.9`) and shapes (`84×84`) are not figures. A clause of prose that names a
row of a linked table by its label (a first cell of two words or more, "one torch thread")
may quote only that row's figures: one found only in other rows was taken from the wrong
row. (Rows labelled by a number, or named in other words than their label, are not
checked this way.)
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [
    ROOT / "README.md",
    *sorted(set((ROOT / "docs").glob("*.md")) - {ROOT / "docs/changelog.md"}),
]
TIMES = "\u00d7"  # the multiplication sign of "8.7x"
LINK = re.compile(
    r"\]\(((?:\.\./)*(?:benchmarks/)?results/[\w./-]+?\.(?:md|log|txt))(?:#[-\w]*)?\)"
)
DERIVED = re.compile(r"<!-- derived: ([\d.]+) = ([\d.+\-*/() ]+) -->")
UNIT = rf"(?:{TIMES}|\s?µs\b|\s?ms\b|\s?GiB\b|\s?MiB\b|\s?%|\s?s\b)"
NUMBER = re.compile(
    rf"(?<![\w.{TIMES}/-])(\d[\d,]*\.\d+|\d[\d,]*(?={UNIT}))(?![\w.]*\d)(?![+{TIMES}]\d)"
)
# A block with no results link quotes figures where it speaks of measuring; elsewhere its
# bare decimals are versions or settings ("Gymnasium 1.0", "below 0.10").
MEASURED = re.compile(
    rf"measured|faster|slower|\btimes?\b|{TIMES}|µs|steps/s|median|fastest|\bratio|of its time",
    re.IGNORECASE,
)
VERSION = re.compile(
    r"(?:jax|jaxlib|python|gymnasium|gymnax|brax|playground|mujoco|ale-py|flashbax|cpprb|"
    r"torch|sb3|jaxbuf|cuda|flax|orbax|pyright|version|versions|release|v)\s*$",
    re.IGNORECASE,
)


def prose(block: str) -> str:
    """The block without code spans, link targets, derivations and shapes."""
    block = re.sub(r"`[^`]*`", " ", block)
    block = re.sub(r"\]\([^)]*\)", "]", block)
    block = DERIVED.sub(" ", block)
    return re.sub(rf"\d+{TIMES}\d+(?:{TIMES}\d+)?", " ", block)


def figures(block: str, bare: bool = True) -> list[str]:
    """The measured figures a block quotes; with `bare` false, only those with a unit."""
    text, found = prose(block), []
    for match in NUMBER.finditer(text):
        before = text[max(0, match.start() - 14) : match.start()]
        after = text[match.end() : match.end() + 2]
        if VERSION.search(before) or re.search(r"[=<>]\s*$", before) or after[:1] == "+":
            continue
        if bare or re.match(UNIT, text[match.end() :]):
            found.append(match.group(1).replace(",", ""))
    return found


def numbers_in(files: list[pathlib.Path]) -> list[str]:
    return [n.replace(",", "") for f in files for n in re.findall(r"\d[\d,]*\.?\d*", f.read_text())]


def withdrawn(files: list[pathlib.Path]) -> set[str]:
    """Figures a results file itself takes back: those in parentheses in a sentence that
    says it is "left out" (a row that is not a measurement of what the table measures)."""
    found = set()
    for text in (f.read_text() for f in files):
        for sentence in re.findall(r"(?:^|(?<=\. ))[^\n]*?\bleft out\b", text, re.M):
            found |= set(re.findall(r"\((\d+\.\d+)\)", sentence.rsplit(". ", 1)[-1]))
    return found


def labelled_rows(files: list[pathlib.Path]) -> dict[str, list[str]]:
    """The numbers of each table row of the files, by the row's label (its first cell, in
    lower case, without markup), for labels of two words or more (a header row has none)."""
    rows: dict[str, list[str]] = {}
    for lines in (f.read_text().splitlines() for f in files):
        for line, following in zip(lines, [*lines[1:], ""], strict=True):
            if not line.startswith("|") or RULE.fullmatch(line) or RULE.fullmatch(following):
                continue
            first, *rest = line.strip().strip("|").split("|")
            label = re.sub(r"[`*_]", "", first).strip().lower()
            if len(label.split()) >= 2 and re.search(r"[a-z]", label):
                rows.setdefault(label, []).extend(numbers_in_text("|".join(rest)))
    return rows


RULE = re.compile(r"\|[-:| ]+\|?")


def numbers_in_text(text: str) -> list[str]:
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*\.?\d*", text)]


def misattributed(block: str, files: list[pathlib.Path]) -> list[str]:
    """Figures of a prose clause that names a row of a linked table (by its label) but that
    stand in the table only in other rows: a figure taken from the wrong row."""
    rows, found = labelled_rows(files), []
    if block.lstrip().startswith("|") or not rows:
        return found
    everywhere = [n for numbers in rows.values() for n in numbers]
    for clause in re.split(r"[,;:]\s|\.\s|\sand\s", prose(block).lower()):
        named = [label for label in rows if re.search(rf"(?<![\w-]){re.escape(label)}(?![\w-])",
                                                      clause)]  # fmt: skip
        own = [n for label in named for n in rows[label]]
        found += [f for f in figures(clause) if named and not held(f, own) and held(f, everywhere)]
    return found


def held(figure: str, numbers: list[str]) -> bool:
    """Whether `figure` is one of `numbers` at the figure's precision."""
    places = len(figure.partition(".")[2])
    for number in numbers:
        try:
            value = float(number)
        except ValueError:
            continue
        if len(number.partition(".")[2]) >= places and f"{value:.{places}f}" == figure:
            return True
    return False


def blocks(text: str):
    """(block, the results files that govern it) for each block of a page."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    lead: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith("#"):
            lead = []
            continue
        links = LINK.findall(block)
        yield block, links or (lead if block.lstrip().startswith("|") else [])
        if links:
            lead = links


def problems(page: pathlib.Path) -> list[str]:
    """What the page quotes that its results files do not hold."""
    found = []
    for block, links in blocks(page.read_text()):
        # without a results file, bare decimals are versions or settings unless the block
        # speaks of measuring
        quoted = figures(block, bare=bool(links) or bool(MEASURED.search(prose(block))))
        if not quoted and not DERIVED.search(block):
            continue
        files = [RESULTS / pathlib.Path(link).name for link in links]
        missing = [str(f.relative_to(ROOT)) for f in files if not f.exists()]
        where = block.strip().splitlines()[0][:80]
        if missing or not files:
            found.append(f"{where!r}: {quoted} with {'no results link' if not files else missing}")
            continue
        numbers = numbers_in(files)
        for figure, expression in DERIVED.findall(block):
            operands = re.findall(r"\d+\.?\d*", expression)
            places = len(figure.partition(".")[2])
            wrong = f"{eval(expression):.{places}f}" != figure  # digits and + - * / ( ) only
            if wrong or not all(held(x, numbers) for x in operands):
                found.append(f"{where!r}: the derivation {figure} = {expression} does not hold")
        derived = {figure for figure, _ in DERIVED.findall(block)}
        absent = [f for f in quoted if f not in derived and not held(f, numbers)]
        if absent:
            found.append(f"{where!r}: {absent} not in {[f.name for f in files]}")
        elsewhere = misattributed(block, files)
        if elsewhere:
            found.append(f"{where!r}: {elsewhere} stand in other rows than the one it names")
        taken_back = sorted(set(quoted) & withdrawn(files))
        if taken_back:
            found.append(f"{where!r}: {taken_back}, which {[f.name for f in files]} leaves out")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_quoted_figure_is_in_the_results_file_the_page_links(page):
    assert problems(page) == []


def test_the_check_fails_on_a_figure_the_file_lacks(tmp_path):
    table = sorted(RESULTS.glob("*_cpu.md"))[0].name
    good = f"Measured ([table](results/{table})): nothing quoted.\n"
    page = tmp_path / "page.md"
    page.write_text(good)
    assert problems(page) == []
    page.write_text(good + f"\n| a | b |\n|---|---|\n| x | 123456.789{TIMES} |\n")
    assert "123456.789" in problems(page)[0]
    page.write_text("Unlinked: 0.93 of its time.\n")
    assert "no results link" in problems(page)[0]
    page.write_text(f"[t](results/{table}) <!-- derived: 2.5 = 5 / 3 -->\n")
    assert "does not hold" in problems(page)[0]
    # a figure its results file leaves out (not a measurement of the buffer)
    wide = "Seeds 0-2 ([table](results/scale_sac_wide_cpu.md)): 2.64{x}, 1.17{x} and 3.11{x}."
    page.write_text(wide.format(x=TIMES) + "\n<!-- derived: 1.17 = 1981 / 1686 -->\n")
    assert problems(page) == [f"{wide.format(x=TIMES)[:80]!r}: ['1.17'], which "
                              "['scale_sac_wide_cpu.md'] leaves out"]  # fmt: skip


def test_the_check_fails_on_a_figure_from_another_row(tmp_path):
    table = tmp_path / "t_cpu.md"
    rows = [
        "| threads | steps/s | / CleanRL's |",
        "|---|---|---|",
        "| one torch thread | 146.2 | 0.97 |",
        "| default torch threads | 150.6 | 1.00 |",
    ]
    table.write_text("\n".join(rows) + "\n")
    assert misattributed("With one torch thread, steps/s are 0.97 of CleanRL's.", [table]) == []
    wrong = "With one torch thread steps/s are 0.97\u20131.00 of CleanRL's."  # an en dash
    assert misattributed(wrong, [table]) == ["1.00"]
    assert misattributed("One torch thread: 0.97; default torch threads: 1.00.", [table]) == []


def test_versions_settings_and_shapes_are_not_figures():
    text = f"JAX 0.10.2, Python 3.11, `prioritized(0.6)`, \u03b3 = 0.9, 84{TIMES}84, Brax 0.14+"
    assert figures(text) == []
    quoted = f"0.92 of its time, 8.7{TIMES} faster, 25 µs, 1,024 ms"
    assert figures(quoted) == ["0.92", "8.7", "25", "1024"]


HISTORY = re.compile(
    r"\bissues?\s+\d|before\s+(?:this|the)\s+(?:change|release|reuse|fix)|\bused\s+to\b|"
    r"\bsince\s+issue|\bthis\s+session\b",
    re.IGNORECASE,
)
CONTRIBUTING = {"architecture.md", "census.md"}  # developer pages, outside the user navigation


USER_PAGES = [page for page in PAGES if page.name not in CONTRIBUTING]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_user_pages_say_what_to_do_not_what_happened(page):
    """History (our issue numbers, "before this change") belongs in the changelog."""
    found = [m.group(0) for m in HISTORY.finditer(re.sub(r"`[^`]*`", " ", page.read_text()))]
    assert found == []


def linked_tables() -> set[str]:
    """The results tables the README and the pages link, by name (`scale_apart_cpu`)."""
    return {pathlib.Path(link).stem for page in PAGES for link in LINK.findall(page.read_text())}


def test_every_cpu_table_a_page_links_is_written_by_run_all():
    from benchmarks.run_all import RUNS

    written = {f"{table}_cpu" for run in RUNS.values() for table in run.writes}
    assert sorted(t for t in linked_tables() if t.endswith("_cpu") and t not in written) == []


def test_the_report_holds_every_table():
    report = (RESULTS / "REPORT.md").read_text()
    for table in sorted(RESULTS.glob("*_*.md")):
        if table.stem.rsplit("_", 1)[1] in ("cpu", "gpu"):
            lines = table.read_text().splitlines()
            measured = [line for line in lines if line.startswith("Measured")][:1]
            assert all(line.removeprefix("# ") in report for line in lines[:1] + measured), table


def test_every_table_names_its_command_threads_and_jaxbuf():
    """Each results table's header (its first lines) says how to run it again, on how many
    threads it ran, and, for a GPU table, which jaxbuf it measured."""
    unsaid = []
    for table in sorted(RESULTS.glob("*_*.md")):
        backend = table.stem.rsplit("_", 1)[1]
        if backend not in ("cpu", "gpu"):
            continue
        head = "\n".join(table.read_text().splitlines()[:8])
        said = {
            "command": re.search(r"Command:|command that runs it|`python -m |its runs are", head),
            "threads": re.search(r"threads|Threads|XLA on", head),
            "jaxbuf": backend == "cpu" or re.search(r"jaxbuf \d", head),
        }
        unsaid += [f"{table.name}: {what}" for what, found in said.items() if not found]
    assert unsaid == []


def test_every_cpu_table_a_page_links_measured_this_release():
    """A CPU table the pages quote was measured by this minor version, or every block that
    links it names the release that measured it (GPU tables name theirs where quoted: a
    GPU is not always at hand)."""
    import jaxbuf

    release = ".".join(jaxbuf.__version__.split(".")[:2])
    old = []
    for name in sorted(t for t in linked_tables() if t.endswith("_cpu")):
        header = (RESULTS / f"{name}.md").read_text()[:2000]
        version = re.search(r"jaxbuf[ =]+(\d+\.\d+\.\d+)", header)
        if version is None or version.group(1).startswith(release + "."):
            continue
        said = f"jaxbuf {version.group(1)}"
        unsaid = [page.name for page in PAGES for block, links in blocks(page.read_text())
                  if f"results/{name}.md" in block and said not in block]  # fmt: skip
        if unsaid:
            old.append(f"{name} ({said}), unsaid in {sorted(set(unsaid))}")
    assert old == []
