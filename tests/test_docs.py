"""The manual is checked like code: what it links, names and tells you to type must exist.

README.md, CONTRIBUTING.md and docs/*.md (the pages) are read as GitHub renders them:
- every relative link and #anchor resolves (GitHub's heading slugs);
- every backticked repo path exists, and every backticked `dt.x.y` name imports or resolves;
- every `dt ...` line in a bash / console / shell block parses with that command's own
  argparse parser (parsed, never run: the parser is stopped as soon as it returns);
- README.md stays short enough to read, and the architecture page is its generator's output.
A sentence in them must stay true at the next commit without anyone re-measuring, so no page,
and no comment or docstring in dt/, names a session, an engineer, an issue number, a time of
day or a load average: those belong to the records under benchmarks/, each of which opens
with the header fields that say how its figures were made.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from dt.tools import architecture, cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORDS = sorted((ROOT / "benchmarks").glob("*.md"))
README_LINES = 300
RECORD_FIELDS = ("command", "commit", "machine", "versions", "date", "load")
RECORD_NAME = re.compile(r"^[a-z0-9]+_[a-z0-9]+_\d{8}_[a-z0-9.-]+\.md$")  # topic_hardware_date_entity
TOP_LEVEL = {"dt", "tests", "docs", "benchmarks", ".ci", "results"}  # a backticked path starting so
ROOT_FILES = {"README.md", "CONTRIBUTING.md", "LICENSE", "pyproject.toml", "requirements.txt"}
SHELL = {"bash", "console", "shell", "sh"}

# What a sentence that is true of one run looks like.
NARRATIVE = {
    "a session": re.compile(r"\b(this|that|last|next|previous|earlier|the same|each|every) sessions?\b"
                            r"|\bsessions? (before|earlier|ago)\b", re.I),
    "an engineer": re.compile(r"\b(an?other|other|\w+ other|several|\d+) engineers?\b"
                              r"|\bengineers?'s? (runs?|work|tests?|load)\b", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+|(?:^|[\s(])#\d+\b", re.I),
    "a time of day": re.compile(r"\b\d{1,2}:\d{2}(:\d{2})?( ?UTC|Z\b)|\b\d{1,2}:\d{2}-\d{1,2}:\d{2}\b", re.I),
    "a load average": re.compile(r"\bload( average)?( of| at| was| from)? \d", re.I),
}
# An upstream project's issue ("torch issue #135712") is a reference, not this project's history.
UPSTREAM = re.compile(r"\b(py)?torch issue #?\d+|https?://\S+", re.I)
# Files in dt/ whose comments still tell history; each is to be rewritten as a reason, then removed
# from this list (the test covers every other file in dt/).
NARRATIVE_IN_CODE: set[str] = set()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _prose(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept): links there are not links."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)


def _code_spans(text: str) -> Iterator[str]:
    for line in _prose(text).splitlines():
        yield from re.findall(r"`([^`\n]+)`", line)


def _fenced(text: str) -> Iterator[tuple[str, list[str]]]:
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        yield lang, body.splitlines()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation but - and _ dropped."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as GitHub numbers them."""
    counts: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        found = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if found:
            slug = _slug(found.group(1))
            anchors.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
            counts[slug] = counts.get(slug, 0) + 1
    return anchors


def _links(path: Path) -> Iterator[str]:
    prose = re.sub(r"`[^`\n]+`", "", _prose(path.read_text()))
    yield from re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)


@pytest.mark.parametrize("page", PAGES + RECORDS, ids=_rel)
def test_every_relative_link_and_anchor_resolves(page):
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:: not ours to check
            continue
        file, _, anchor = target.partition("#")
        where = (page.parent / file).resolve() if file else page
        assert where.exists(), f"{_rel(page)}: link to {target}: no such file"
        if anchor:
            assert where.suffix == ".md", f"{_rel(page)}: anchor into a non-page: {target}"
            assert anchor in _anchors(where), f"{_rel(page)}: link to {target}: no such heading"


def _repo_path(span: str) -> str | None:
    """The repository path a code span names, if it looks like one ('tests/x.py::test_y' -> 'tests/x.py')."""
    token = span.split("::")[0].rstrip(".,:;")
    if " " in token:
        return None
    if token in ROOT_FILES:
        return token
    if re.fullmatch(r"test_\w+\.py", token):  # a test file named alone lives in tests/
        return f"tests/{token}"
    first = token.split("/")[0]
    return token if "/" in token and first in TOP_LEVEL else None


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_backticked_path_exists(page):
    for span in _code_spans(page.read_text()):
        path = _repo_path(span)
        if path is not None:
            assert list(ROOT.glob(path.rstrip("/"))), f"{_rel(page)}: `{span}`: no such file here"


def _resolve(name: str) -> object:
    if name.endswith(".__main__"):  # importing it would run the command
        return importlib.util.find_spec(name) or importlib.import_module(name)
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_backticked_dt_name_resolves(page):
    for span in _code_spans(page.read_text()):
        found = re.match(r"^(dt(?:\.[A-Za-z_]\w*)+)", span)
        if found:
            try:
                _resolve(found.group(1))
            except (ImportError, AttributeError) as exc:
                pytest.fail(f"{_rel(page)}: `{span}`: {found.group(1)} does not resolve ({exc})")


class _Parsed(Exception):
    """Raised as the outermost argparse parse returns: the command parsed, and must not run."""


@contextlib.contextmanager
def _stop_after_parsing() -> Iterator[None]:
    """Every parse runs whole (parse_args' check for unknown options included), then stops the command."""
    parse_args, parse_known_args, depth = (argparse.ArgumentParser.parse_args,
                                           argparse.ArgumentParser.parse_known_args, [0])

    def stopping(original):  # noqa: ANN001, ANN202 - wraps argparse's own methods
        def parse(self, args=None, namespace=None):  # noqa: ANN001, ANN202
            depth[0] += 1
            try:
                parsed = original(self, args, namespace)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # the outermost parse: a subcommand's returns inside its parent's
                raise _Parsed
            return parsed
        return parse

    argparse.ArgumentParser.parse_args = stopping(parse_args)
    argparse.ArgumentParser.parse_known_args = stopping(parse_known_args)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = (parse_args,
                                                                                      parse_known_args)


def _parse(words: list[str]) -> str | None:
    """None if `dt WORDS...` parses with its command's parser, else what the parser said."""
    if not words or words[0] in ("-h", "--help", "--version"):
        return None
    if words[0] == "bench":
        module, rest = cli.BENCHES.get(words[1] if len(words) > 1 else ""), words[2:]
    else:
        module, rest = cli.COMMANDS.get(words[0], ("",))[0], words[1:]
    if not module:
        return f"no such command: dt {' '.join(words[:2])}"
    command = importlib.import_module(module)
    err = io.StringIO()
    with _stop_after_parsing(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            command.main(rest)
        except _Parsed:
            return None
        except SystemExit as exc:
            if exc.code in (0, None):  # --help
                return None
            return err.getvalue().strip() or f"exit {exc.code}"
    return "ran to the end without parsing its options"


def _dt_commands(lang: str, lines: list[str]) -> Iterator[list[str]]:
    """Every `dt ...` (or `python -m dt ...`) command in a shell block, as words after `dt`."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines()
    for line in joined:
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        words = shlex.split(re.sub(r"\$\([^)]*\)", "SUBST", line), comments=True)  # VAR=$(...) is one word
        segment: list[str] = []
        redirected = False  # `> file`: the shell's, not the command's
        for word in [*words, "&&"]:
            if re.match(r"^\d?[<>]", word):
                redirected = not re.match(r"^\d?[<>]+&?\S", word)  # `>file` and `2>&1` take no next word
                continue
            if redirected:
                redirected = False
                continue
            if word not in ("&&", "||", ";", "|"):
                segment.append(word)
                continue
            while segment and re.match(r"^[A-Z_][A-Z0-9_]*=", segment[0]):  # VAR=value before it
                segment.pop(0)
            if segment[:1] == ["dt"]:
                yield segment[1:]
            elif segment[:3] == ["python", "-m", "dt"]:
                yield segment[3:]
            if "--" in segment and segment[segment.index("--") + 1:][:3] == ["python", "-m", "dt"]:
                yield segment[segment.index("--") + 4:]  # what dt cluster runs on every host
            segment = []


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_dt_command_shown_parses(page):
    for lang, lines in _fenced(page.read_text()):
        if lang in SHELL:
            for words in _dt_commands(lang, lines):
                said = _parse(words)
                assert said is None, f"{_rel(page)}: `dt {' '.join(words)}`: {said}"


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines: at most {README_LINES}"


# A word each kind of narrative line holds: a file or line without it skips that pattern.
CLUE = {"a session": "session", "an engineer": "engineer", "an issue number": ("issue", "#"),
        "a time of day": ":", "a load average": "load"}


def _narrative(path: Path) -> Iterator[str]:
    text = path.read_text()
    lower = text.lower()
    kinds = [(what, clues if isinstance(clues, tuple) else (clues,)) for what, clues in CLUE.items()]
    kinds = [(what, clues) for what, clues in kinds if any(c in lower for c in clues)]
    for number, line in enumerate(lower.splitlines(), 1):
        for what, clues in kinds:
            if any(c in line for c in clues) and NARRATIVE[what].search(UPSTREAM.sub("", line)):
                yield f"{_rel(path)}:{number} names {what}: {text.splitlines()[number - 1].strip()}"


def test_no_page_tells_history():
    told = [said for page in PAGES for said in _narrative(page)]
    assert not told, "true of one run: move it to a record under benchmarks/\n" + "\n".join(told)


def test_no_comment_in_dt_tells_history():
    files = [p for p in sorted((ROOT / "dt").rglob("*.py")) if _rel(p) not in NARRATIVE_IN_CODE]
    told = [said for path in files for said in _narrative(path)]
    assert not told, "a comment says why, not when:\n" + "\n".join(told)
    mended = [name for name in NARRATIVE_IN_CODE if not list(_narrative(ROOT / name))]
    assert not mended, f"no longer tells history: take it off NARRATIVE_IN_CODE: {mended}"


def _header(record: Path) -> dict[str, str]:
    rows = re.findall(r"^\| ([a-z]+) \| (.*?) \|$", record.read_text().split("\n\n", 2)[1], flags=re.M)
    return dict(rows)


@pytest.mark.parametrize("record", RECORDS, ids=_rel)
def test_every_record_says_how_its_figures_were_made(record):
    assert RECORD_NAME.match(record.name), f"{record.name}: name it topic_hardware_date_entity.md"
    header = _header(record)
    missing = [f for f in RECORD_FIELDS if not header.get(f, "").strip()]
    assert not missing, f"{_rel(record)}: its header table lacks {', '.join(missing)}"


def test_every_figure_has_its_record():
    assert not list((ROOT / "docs").glob("*.png")), "a plot lives beside its record, in benchmarks/"
    image = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")
    shown = {name for record in RECORDS for name in image.findall(record.read_text())}
    assert {p.name for p in (ROOT / "benchmarks").glob("*.png")} <= shown, "a plot no record shows"
    for page in PAGES:
        text = page.read_text()
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", _prose(text)):
            records = [r for r in re.findall(r"\]\(([^)#]*benchmarks/[^)#]+\.md)", text)
                       if Path(image).name in (page.parent / r).read_text()]
            assert records, f"{_rel(page)}: {image} is shown without a link to the record it comes from"


def test_the_architecture_page_is_its_generators_output():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert page == architecture.render(ROOT), "python -m dt.tools.architecture > docs/architecture.md"
