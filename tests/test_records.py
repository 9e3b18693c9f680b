"""Records of runs (dt.record) and the README's results table built from them (dt.tools.records).

A record is written by running a command under the recorder: its header is checked field by
field against this machine and checkout, its output against what the command printed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dt import record
from dt.args import cores
from dt.tools import records
from dt.tools.cli import main as dt_main

ROOT = Path(__file__).resolve().parent.parent

# Prints on stdout and stderr in turn (the record keeps the order), declares a headline the way
# a dt command does (dt.record.headline, through the file the recorder names), exits 3.
CHILD = textwrap.dedent("""
    import os, sys
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    print("progress 10%\\rprogress 100%")
    print("a fence inside: ```")
    from dt import record
    record.rerun("dt child", [], None, "child", "test")  # as every command's hook: takes the variable
    assert record.HEADLINE_VARIABLE not in os.environ  # what this child starts cannot write there
    record.headline("one figure:\\n 12.3 ms")
    sys.exit(3)
""")


def test_a_recorded_run_keeps_what_it_printed_under_a_well_formed_header(tmp_path, capfd):
    # `python -m dt.record` (as .ci/gpu runs it) through its main, here; CHILD is a process of its own
    status = record.main(["child", "a_test", str(tmp_path), "--", sys.executable, "-c", CHILD])
    out = capfd.readouterr()
    path, = tmp_path.glob("*.md")
    assert status == 3  # the command's own status
    assert out.err.endswith(f"record: {path}\n")
    assert "to stdout\nto stderr\n" in out.out  # the terminal saw it as it ran
    h = record.read_header(path)
    assert path.name == f"child_cpu{cores()}_{h['date'][:10].replace('-', '')}_a-test.md"  # "_": a part's end
    assert list(h) == list(record.FIELDS)
    assert h["command"] == shlex.join([sys.executable, "-c", CHILD]).replace("\n", "\\n")  # one line
    assert h["headline"] == "one figure: 12.3 ms"  # one line, whitespace collapsed
    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert re.fullmatch(rf"{here}(\+dirty)?", h["commit"]) if here else h["commit"] == "not a git checkout"
    assert re.fullmatch(r".+, \d+ cores, \d+\.\d GiB memory, (no GPU|\d+x .+)", h["machine"])
    import torch

    import dt
    assert h["versions"].startswith(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
                                    f"dt {dt.__version__}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h["date"])
    assert re.fullmatch(r"\d+\.\d\d at the start, \d+\.\d\d at the end \(1-minute average\)", h["load"])
    assert re.fullmatch(r"3 after \d+\.\d s", h["exit"])
    text = path.read_text()
    # the output verbatim, in order, a progress bar as last drawn, in a fence longer than any inside
    assert "````text\nto stdout\nto stderr\nprogress 100%\na fence inside: ```\n````\n" in text
    title = f"# `{shlex.join([sys.executable, '-c', CHILD])}`".replace("\n", "\\n")  # one line too
    assert text.startswith(f"{title}\n\n| field | value |\n|---|---|\n")


@pytest.mark.quick
def test_a_record_is_named_for_its_topic_hardware_day_and_entity():
    assert record.record_name("train", "h200", "20261205", "dp2-tp2") == "train_h200_20261205_dp2-tp2.md"
    assert record.RECORD_NAME.fullmatch("train_h200_20261205_dp2-tp2-2.md")  # a later one, the same day
    assert not record.RECORD_NAME.fullmatch("train_h200_20261205_dp2_tp2.md")  # "_" ends a part


@pytest.mark.quick
@pytest.mark.parametrize("gpus, n_cores, tag", [
    ([], 2, "cpu2"), (["NVIDIA H200"], 16, "h200"), (["NVIDIA H100 80GB HBM3"] * 8, 96, "h100x8"),
    (["NVIDIA A100-SXM4-80GB"], 8, "a100"), (["NVIDIA GeForce RTX 4090"], 8, "rtx4090"),
    (["NVIDIA GH200 480GB"], 72, "gh200"), (["AMD Instinct MI300X"] * 2, 8, "mi300xx2")])
def test_hardware_names_the_gpu_model_and_count_or_the_cores(gpus, n_cores, tag):
    assert record.hardware(gpus, n_cores) == tag


def _fields(topic: str, date: str, headline: str) -> dict[str, str]:
    return {"command": f"`dt {topic} --record`", "headline": headline, "commit": "abc1234",
            "machine": "CPU, 2 cores, 8.0 GiB memory, no GPU",
            "versions": "python 3.11.7, torch 2.13.0, dt 0.2.0", "date": date,
            "load": "0.10 at the start, 0.20 at the end (1-minute average)", "exit": "0 after 1.0 s"}


@pytest.mark.quick
def test_a_record_is_never_overwritten(tmp_path):
    fields = _fields("train", "2026-12-05T10:00:00Z", "first | with a bar")
    path = tmp_path / "train_cpu2_20261205_dp2.md"
    written = [record.write_record(path, {**fields, "headline": h}, out)
               for h, out in (("first | with a bar", "one"), ("second", "two"), ("third", "three"))]
    assert [p.name for p in written] == ["train_cpu2_20261205_dp2.md", "train_cpu2_20261205_dp2-2.md",
                                         "train_cpu2_20261205_dp2-3.md"]
    assert record.read_header(written[0]) == {**fields, "command": "dt train --record"}  # | escaped and back
    assert "\none\n" in written[0].read_text() and all(record.RECORD_NAME.fullmatch(p.name) for p in written)


def _fixture_records(directory: Path) -> None:
    for name, date, headline in [
            ("train_cpu2_20261201_dp2.md", "2026-12-01T10:00:00Z", "older"),
            ("train_cpu2_20261205_dp2-tp2.md", "2026-12-05T09:00:00Z", "loss 3.1 -> 2.0 | 900 tokens/s"),
            ("train_cpu2_20261206_by-hand.md", "2026-12-06, 12 s of wall time", ""),  # no headline: not shown
            ("train_h200_20261130_dp8.md", "2026-11-30T10:00:00Z", "on the GPU"),
            ("collectives_cpu2_20261202_all-reduce-w2.md", "2026-12-02T10:00:00Z", "ring 1.2 ms"),
            ("collectives_cpu2_20261202_all-reduce-w4.md", "2026-12-02T08:00:00Z", "earlier that day")]:
        fields = _fields(name.split("_")[0], date, headline)
        record.write_record(directory / name, fields, "output")


def test_the_table_has_the_newest_record_of_each_topic_and_hardware_linked(tmp_path):
    bench = tmp_path / "benchmarks"
    _fixture_records(bench)
    (bench / "README.md").write_text("what the folder holds\n")  # not a record: skipped
    lines = records.results_table(bench, tmp_path).splitlines()
    cells = [[cell.strip() for cell in line.strip("| ").split(" | ")] for line in lines]
    assert cells[0] == ["topic", "hardware", "headline", "record"] and lines[1] == "| --- | --- | --- | --- |"
    assert cells[2:] == [
        ["collectives", "cpu2", "ring 1.2 ms",
         "[collectives_cpu2_20261202_all-reduce-w2](benchmarks/collectives_cpu2_20261202_all-reduce-w2.md)"],
        ["train", "cpu2", "loss 3.1 -> 2.0 \\| 900 tokens/s",
         "[train_cpu2_20261205_dp2-tp2](benchmarks/train_cpu2_20261205_dp2-tp2.md)"],
        ["train", "h200", "on the GPU", "[train_h200_20261130_dp8](benchmarks/train_h200_20261130_dp8.md)"]]
    assert records.results_table(tmp_path / "none", tmp_path) == records.NO_RECORDS


@pytest.mark.quick
def test_a_file_without_the_header_fields_or_a_records_name_is_named(tmp_path):
    path = record.write_record(tmp_path / "train_cpu2_20261205_dp2.md", _fields("train", "x", "y"), "out")
    path.write_text(path.read_text().replace("| load |", "| lode |"))
    with pytest.raises(ValueError, match=rf"{path.name}: its header lacks load"):
        records.read_records(tmp_path)
    path.rename(tmp_path / "train_cpu2_2026-12-05_dp2.md")
    with pytest.raises(ValueError, match="train_cpu2_2026-12-05_dp2.md: not named <topic>_<hardware>_"):
        records.read_records(tmp_path)


@pytest.mark.quick
def test_check_holds_the_readme_block_to_the_generated_table(tmp_path):
    bench = tmp_path / "benchmarks"
    _fixture_records(bench)
    readme = tmp_path / "README.md"
    readme.write_text(f"# dt\n\n{records.RESULTS_BEGIN}\nstale\n{records.RESULTS_END}\n\nmore\n")
    assert "is not the one the records" in records.check(readme, bench)
    assert records.write(readme, bench)
    assert records.check(readme, bench) is None
    assert readme.read_text().endswith(f"{records.RESULTS_END}\n\nmore\n")
    newer = _fields("train", "2026-12-07T09:00:00Z", "newer")
    record.write_record(bench / "train_cpu2_20261207_dp4.md", newer, "output")
    assert "is not the one the records" in records.check(readme, bench)  # a new record: regenerate
    readme.write_text("# dt\n")
    assert "has no <!-- results:begin -->" in records.check(readme, bench)


@pytest.mark.quick
def test_a_command_that_is_not_there_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        record.main(["train", "run", str(tmp_path), "--", "no-such-command-here", "--flag"])
    assert exit_.value.code == 2 and "no command 'no-such-command-here'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.quick
def test_the_readmes_results_table_is_the_records():
    assert records.check(ROOT / "README.md", ROOT / "benchmarks") is None


@pytest.mark.quick
def test_the_planner_page_shows_the_newest_published_records_summary():
    """docs/planner.md's block is the newest `dt plan --published` record's summary, each source's
    row and the overall one, linked to the record."""
    page = ROOT / "docs" / "planner.md"
    assert records.check(page, ROOT / "benchmarks") is None
    block = records.published_summary(ROOT / "benchmarks", page.parent)
    assert "../benchmarks/plan_" in block and "\nall " in block and "\nsource " in block


def test_a_published_summary_is_the_records_lines(tmp_path):
    bench = tmp_path / "benchmarks"
    def summary_of(median: str) -> str:
        return (f"source   rows   median\nbloom-176b   100   {median}\nall   100   {median}\n"
                "not priced: 2 rows: float8")

    published = {**_fields("plan", "2026-12-07T09:00:00Z", "every published row"),
                 "command": "`dt plan --published --record`"}
    for date, median in (("2026-12-07T09:00:00Z", "11.3%"), ("2026-12-07T10:00:00Z", "6.9%")):
        # the second, of the same name, is written beside the first as ..._published-2.md
        record.write_record(bench / "plan_catalogue_20261207_published.md", {**published, "date": date},
                            f"rows...\n{summary_of(median)}\nafter")
    check = _fields("plan", "2026-12-07T11:00:00Z", "a check here")  # newer, but no --published
    record.write_record(bench / "plan_cpu2_20261207_check-world2.md", check, "all   1   50%\n")
    page = tmp_path / "planner.md"
    page.write_text(f"# planner\n{records.PUBLISHED_BEGIN}\n{records.PUBLISHED_END}\n")
    assert "is not the one the records" in records.check(page, bench)
    assert records.write(page, bench) and records.check(page, bench) is None
    text = page.read_text()
    assert summary_of("6.9%") in text and "(benchmarks/plan_catalogue_20261207_published-2.md)" in text
    assert "rows..." not in text and "after" not in text and "11.3%" not in text


@pytest.mark.quick
def test_dt_records_check_exit_status(tmp_path):
    bench = tmp_path / "benchmarks"
    _fixture_records(bench)
    readme = tmp_path / "README.md"
    readme.write_text(f"{records.RESULTS_BEGIN}\n{records.RESULTS_END}\n")
    assert records.main([str(bench), "--check", str(readme)]) == 1
    assert records.main([str(bench), "--write", str(readme)]) == 0
    assert records.main([str(bench), "--check", str(readme)]) == 0


# -- the commands' --record ---------------------------------------------------------------------------


@pytest.mark.quick
def test_every_recording_command_takes_record_dir():
    from dt.bench import collectives
    from dt.bench.scaling import cli as scaling
    from dt.plan import cli as plan
    from dt.train import cli as train

    assert train.parse_args(["--record"]).record == "benchmarks"
    assert plan.parse_args(["--record", "runs"]).record == "runs"
    assert collectives.parse_args(["--record=runs"]).record == "runs"
    assert scaling.parse_args(["--quick", "--record"])[1].record == "benchmarks"
    assert train.parse_args([]).record is None


@pytest.mark.quick
def test_tune_refuses_record_without_a_measurement(capsys):
    from dt.tools import tune

    with pytest.raises(SystemExit) as exc:
        tune.main(["--show", "--record"])
    assert exc.value.code == 2
    assert "dt tune: error: --record keeps a run that measures" in capsys.readouterr().err


@pytest.mark.quick
def test_bad_options_are_refused_before_anything_is_recorded(tmp_path, capsys):
    from dt.train import cli as train

    with pytest.raises(SystemExit) as exc:
        train.main(["--record", str(tmp_path / "r"), "--dp", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--dp" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(240)
def test_dt_bench_collectives_record_end_to_end(tmp_path, capfd):
    # through dt's entry point, here; the recorded run is a process of its own, as `python -m dt` is
    argv = ["bench", "collectives", "--world", "1", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0",
            "--algorithms", "ring", "--quiet", "--record", str(tmp_path)]
    status = dt_main(argv)
    out = capfd.readouterr()
    assert status == 0, out.err
    path, = tmp_path.glob("collectives_*_all-reduce-w1.md")
    h = record.read_header(path)
    assert h["command"] == "dt " + " ".join(argv)
    assert re.fullmatch(r"all_reduce 1,024 B world 1: fastest ring on shared memory \S+ \S+, busbw \S+ GB/s, "
                        r"\d+\.\d\dx the time of torch's on gloo's sockets", h["headline"]), h["headline"]
    assert "# Avg bus bandwidth" in path.read_text() and "# Avg bus bandwidth" in out.out


@pytest.mark.quick
def test_dt_train_headline_is_the_mesh_the_loss_and_the_rate():
    from dt.train import cli as train

    args = train.parse_args(["--dp", "2", "--tp", "2", "--steps", "3"])
    r0 = {"losses": [3.5, 3.0, 2.5], "tokens_per_s": 1234.4, "start": 0, "flops_per_token": 2e6}
    assert train.headline(args, r0) == ("dp=2 tp=2 (4 processes), 4 layers x 64: loss 3.5000 -> 2.5000 in "
                                        "3 steps, 1234 tokens/s")
    args.peak_total = 1e12
    assert train.headline(args, r0).endswith(", MFU 0.25%")  # 2e6 FLOP x 1234.4 / 1e12


@pytest.mark.quick
def test_dt_plan_declares_its_first_ranked_layout(tmp_path, monkeypatch, capsys):
    from dt.plan import cli as plan

    declared = tmp_path / "headline"
    monkeypatch.setattr(record, "_headline_file", str(declared))  # as in a recorded run
    assert plan.main(["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64",
                      "--seq", "1024", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["layouts"][0]
    assert declared.read_text() == (f"gpt2 on {data['cluster']}: first ranked {first['layout']} "
                                    f"{first['step_s'] * 1e3:.2f} ms predicted\n")


def test_a_taken_headline_file_is_written_only_by_its_taker(tmp_path, monkeypatch):
    """A recorded test suite takes the headline file: a command its tests run in-process declares
    nothing there, and the suite's own summary is the headline."""
    declared = tmp_path / "headline"
    monkeypatch.setattr(record, "_headline_file", str(declared))  # as in a recorded run
    taken = record.take_headline_file()
    assert taken == str(declared) and record.take_headline_file() is None
    record.headline("a command's figure")
    assert not declared.exists()
    record.headline("1 passed in 0 min 1 s (exit 0)", to=taken)
    assert declared.read_text() == "1 passed in 0 min 1 s (exit 0)\n"
