"""`dt records`: the dated records under benchmarks/, and the README's results table built from them.

    dt records                      # every record, newest first, then the results table
    dt records --check README.md    # exit 1 unless the README's table is the one the records give
    dt records --write README.md    # put it there
    dt records --write docs/planner.md   # the newest dt plan --published summary there

A record is what one run printed, under a header table (dt.record writes it: `dt train
--record`, `dt bench collectives --record`, ...; records written by hand have the same
header). The results table has one row per topic and hardware (the record's name says
both), from the newest record of each that declares a headline: the headline, and a
link to the record. In the README it sits between RESULTS_BEGIN and RESULTS_END, so a
figure there always names the run that produced it; the planner's page holds the newest
`dt plan --published` summary the same way, between PUBLISHED_BEGIN and PUBLISHED_END.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from dt import args as args_
from dt.bench.report import replace_between_markers
from dt.record import DEFAULT_DIRECTORY, RECORD_NAME, REQUIRED, read_header

__all__ = ["PUBLISHED_BEGIN", "PUBLISHED_END", "RESULTS_BEGIN", "RESULTS_END", "RunRecord", "check", "main",
           "newest", "published_summary", "read_records", "results_table", "write"]

RESULTS_BEGIN = "<!-- results:begin -->"
RESULTS_END = "<!-- results:end -->"
# The planner's page shows the newest `dt plan --published` record's summary between these
PUBLISHED_BEGIN = "<!-- published:begin -->"
PUBLISHED_END = "<!-- published:end -->"
NO_RECORDS = "No record declares a headline yet: a command run with `--record` writes one that does."


@dataclass(frozen=True)
class RunRecord:
    path: Path
    topic: str
    hardware: str
    day: str  # YYYYMMDD, from the name
    fields: dict[str, str]  # the header's, by name (dt.record.FIELDS; REQUIRED at least)

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    def newness(self) -> tuple[str, str, str]:
        """What orders records of one topic: the day, then the date field (a time of day when a
        command wrote it), then the name (-2 after the first)."""
        return self.day, self.fields["date"], self.path.name


def read_records(directory: Path) -> list[RunRecord]:
    """Every record in `directory` (its *.md files but a README), newest first; ValueError naming a
    file that is not named as a record or whose header lacks a REQUIRED field."""
    found = []
    for path in sorted(directory.glob("*.md")):
        if path.name.lower() == "readme.md":
            continue
        name = RECORD_NAME.fullmatch(path.name)
        if name is None:
            raise ValueError(f"{path}: not named <topic>_<hardware>_<YYYYMMDD>_<entity>.md")
        fields = read_header(path)
        missing = [field for field in REQUIRED if not fields.get(field)]
        if missing:
            raise ValueError(f"{path}: its header lacks {', '.join(missing)} (dt.record)")
        found.append(RunRecord(path, name["topic"], name["hardware"], name["day"], fields))
    return sorted(found, key=RunRecord.newness, reverse=True)


def newest(records: list[RunRecord]) -> list[RunRecord]:
    """The newest record that declares a headline, of each topic on each hardware; by topic, hardware."""
    kept: dict[tuple[str, str], RunRecord] = {}
    for r in sorted(records, key=RunRecord.newness):
        if r.fields.get("headline"):
            kept[r.topic, r.hardware] = r
    return [kept[key] for key in sorted(kept)]


def results_table(directory: Path, links_from: Path) -> str:
    """The README's table: one row per topic and hardware; each links its record relative to
    `links_from` (the README's folder)."""
    rows = newest(read_records(directory)) if directory.is_dir() else []
    if not rows:
        return NO_RECORDS
    cells = [[r.topic, r.hardware, r["headline"].replace("|", "\\|"),
              f"[{r.path.stem}]({Path(os.path.relpath(r.path, links_from)).as_posix()})"] for r in rows]
    # unpadded: a new record changes its own row of the README, not the whole table's widths
    return "\n".join("| " + " | ".join(row) + " |"
                     for row in [["topic", "hardware", "headline", "record"], ["---"] * 4, *cells])


def published_summary(directory: Path, links_from: Path) -> str:
    """The newest `dt plan --published` record's summary (each source's rows, median and worst error
    of the step and of the memory, the sweeps' placing, what was not priced), linked to the record."""
    every = read_records(directory) if directory.is_dir() else []
    records = [r for r in every if r.topic == "plan" and "--published" in r["command"].strip("`").split()]
    if not records:
        return "No `dt plan --published` record yet: `dt plan --published --record` writes one."
    record = records[0]
    lines = record.path.read_text(encoding="utf-8").splitlines()
    last = next(i for i, line in enumerate(lines) if line.startswith("all "))  # the summary's last row
    first = max(i for i in range(last) if lines[i].startswith("source "))  # its header, not the rows'
    after = [line for line in lines[last + 1:last + 5] if line.startswith(("sweeps:", "not priced"))]
    link = Path(os.path.relpath(record.path, links_from)).as_posix()
    return "\n".join([f"From [{record.path.stem}]({link}) (`{record['command'].strip('`')}`, commit "
                      f"{record['commit']}):", "", "```text", *lines[first:last + 1], *after, "```"])


# Each generated block: its markers and what fills it (from the records' folder, links relative to the page)
BLOCKS = ((RESULTS_BEGIN, RESULTS_END, results_table), (PUBLISHED_BEGIN, PUBLISHED_END, published_summary))


def _between_markers(text: str, begin_marker: str, end_marker: str) -> str | None:
    begin = text.find(begin_marker)
    end = text.find(end_marker, begin + len(begin_marker)) if begin >= 0 else -1
    return None if begin < 0 or end < 0 else text[begin + len(begin_marker): end].strip("\n")


def check(readme: Path, directory: Path) -> str | None:
    """None when each generated block `readme` has (the results table, the published summary) is what
    the records give and it has at least one; else what is wrong, in a line."""
    text = readme.read_text(encoding="utf-8")
    found = 0
    for begin, end, make in BLOCKS:
        body = _between_markers(text, begin, end)
        if body is None:
            continue
        found += 1
        if body != make(directory, readme.resolve().parent):
            return (f"{readme}'s {begin} block is not the one the records in {directory} give: "
                    f"dt records --write {readme}")
    return None if found else f"{readme} has no {RESULTS_BEGIN} ... {RESULTS_END} block"


def write(readme: Path, directory: Path) -> bool:
    """Fill each generated block `readme` has; False (untouched) when it has none."""
    text = original = readme.read_text(encoding="utf-8")
    found = False
    for begin, end, make in BLOCKS:
        new = replace_between_markers(text, make(directory, readme.resolve().parent), begin, end)
        if new is not None:
            text, found = new, True
    if text != original:
        readme.write_text(text, encoding="utf-8")
    return found


def _listing(records: list[RunRecord]) -> str:
    return "\n".join(f"{r.day}  {r.topic:<12} {r.hardware:<8} {r.path}"
                     + (f"\n    {r['headline']}" if r.fields.get("headline") else "") for r in records)


def main(argv: list[str] | None = None) -> int:
    p = args_.Parser(prog="dt records", description=__doc__.split("\n\n")[0],
                     epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", nargs="?", default=DEFAULT_DIRECTORY, metavar="DIR",
                   help=f"where the records are (default {DEFAULT_DIRECTORY}/)")
    done = p.add_mutually_exclusive_group()
    done.add_argument("--check", metavar="README", type=Path, default=None,
                      help="exit 1 unless README's generated blocks (the results table, the "
                           "published summary) are the records'")
    done.add_argument("--write", metavar="README", type=Path, default=None,
                      help="fill README's generated blocks from the records")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    directory = Path(a.directory)
    readme = a.check or a.write
    if readme is not None and not readme.is_file():
        p.error(f"no file {readme}")
    try:
        if a.check:
            wrong = check(a.check, directory)
            print(wrong or f"{a.check}: the results table is the records' ({directory})")
            return 1 if wrong else 0
        if a.write:
            if not write(a.write, directory):
                p.error(f"{a.write} has no {RESULTS_BEGIN} ... {RESULTS_END} block")
            print(f"{a.write}: results table written from {directory}")
            return 0
        records = read_records(directory) if directory.is_dir() else []
    except ValueError as exc:
        print(f"dt records: error: {exc}", file=sys.stderr)
        return 1
    print(_listing(records) or f"no records in {directory}")
    print()
    print(results_table(directory, Path.cwd()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
