"""`dt records`: the dated records under benchmarks/, and the README's results table built from them.

    dt records                      # every record, newest first, then the results table
    dt records --check README.md    # exit 1 unless the README's table is the one the records give
    dt records --write README.md    # put it there

A record is what one run printed, under a header table (dt.record writes it: `dt train
--record`, `dt bench collectives --record`, ...; records written by hand have the same
header). The results table has one row per topic and hardware (the record's name says
both), from the newest record of each that declares a headline: the headline, and a
link to the record. In the README it sits between RESULTS_BEGIN and RESULTS_END, so a
figure there always names the run that produced it.
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

__all__ = ["RESULTS_BEGIN", "RESULTS_END", "RunRecord", "check", "main", "newest", "read_records",
           "results_table", "write"]

RESULTS_BEGIN = "<!-- results:begin -->"
RESULTS_END = "<!-- results:end -->"
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


def _between_markers(text: str) -> str | None:
    begin = text.find(RESULTS_BEGIN)
    end = text.find(RESULTS_END, begin + len(RESULTS_BEGIN)) if begin >= 0 else -1
    return None if begin < 0 or end < 0 else text[begin + len(RESULTS_BEGIN): end].strip("\n")


def check(readme: Path, directory: Path) -> str | None:
    """None when `readme`'s results block is the table the records give; else what is wrong, in a line."""
    body = _between_markers(readme.read_text(encoding="utf-8"))
    if body is None:
        return f"{readme} has no {RESULTS_BEGIN} ... {RESULTS_END} block"
    if body != results_table(directory, readme.resolve().parent):
        return (f"{readme}'s results table is not the one the records in {directory} give: "
                f"dt records --write {readme}")
    return None


def write(readme: Path, directory: Path) -> bool:
    """Put the table in `readme`'s results block; False (untouched) when it has none."""
    text = readme.read_text(encoding="utf-8")
    table = results_table(directory, readme.resolve().parent)
    new = replace_between_markers(text, table, RESULTS_BEGIN, RESULTS_END)
    if new is None:
        return False
    readme.write_text(new, encoding="utf-8")
    return True


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
                      help="exit 1 unless README's results block is the table the records give")
    done.add_argument("--write", metavar="README", type=Path, default=None,
                      help="put the table in README's results block")
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
