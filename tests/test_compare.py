"""`shoal compare`: scheme specs, compare.json rows (speed-ups, null-aware medians), and the command end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FAST
from shoal.cli import app
from shoal.comparison import RUN_FILES, plan_runs
from shoal.config import ConfigError
from shoal.registry import COMPRESSORS, PLANNERS
from shoal.report.rows import add_speedups, median_time, seeds_row, speedup
from shoal.report.schemes import parse_scheme, parse_schemes

SHOAL = [str(Path(sys.executable).with_name("shoal"))]
SUMMARY_FIELDS = ("scheme", "backend", "final_accuracy", "best_accuracy", "target_accuracy", "time_to_target_s",
                  "elapsed_s", "iterations", "bytes_up", "bytes_down", "groups", "per_worker")


def shoal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(SHOAL + list(args), capture_output=True, text=True, timeout=300)


def _sets(*overrides: str) -> list[str]:
    return [arg for o in list(FAST) + list(overrides) for arg in ("--set", o)]


# -- scheme specs ---------------------------------------------------------------------------------------


def test_scheme_specs_become_overrides():
    assert parse_scheme("bsp").overrides == ("sync.scheme=bsp",)
    assert parse_scheme("gssp+sim").overrides == ("sync.scheme=gssp", "compression.similarity.enabled=true")
    spec = parse_scheme(" GSSP+GDTopK ")
    assert spec.name == "gssp+gdtopk" and spec.overrides == ("sync.scheme=gssp", "compression.method=gdtopk")
    assert parse_scheme("ssp+sim+fp16").overrides == (
        "sync.scheme=ssp", "compression.similarity.enabled=true", "compression.method=fp16")
    assert [s.name for s in parse_schemes("bsp, ssp,,gssp")] == ["bsp", "ssp", "gssp"]
    assert parse_scheme("bsp+ina-atp").overrides == (
        "sync.scheme=bsp", "network.aggregation=ina", "network.algorithm=atp")


def test_in_network_plans_compare_and_show_their_routing(tmp_path):
    out = tmp_path / "ina"
    args = ["compare", *_sets("backend.mode=cost", "cluster.workers=8", "run.max_time_s=2", "model.hidden=[2048, 2048]",
                              "network.topology=fattree:k=4", "network.programmable=all"),
            "--schemes", "bsp,bsp+ina-geryon,bsp+ina-grid", "--out", str(out), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = {r["scheme"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows["bsp+ina-grid"]["routing"]["algorithm"] == "grid" and "routing" not in rows["bsp"]
    assert rows["bsp+ina-grid"]["iterations"] > rows["bsp+ina-geryon"]["iterations"] == rows["bsp"]["iterations"]
    page = (out / "report.html").read_text()
    assert "Routing plan" in page and "bsp+ina-grid" in page


@pytest.mark.parametrize("text, fragment", [
    ("gsp", "unknown scheme 'gsp'"),
    ("gssp+zip", "unknown modifier 'zip' in 'gssp+zip'"),
    ("bsp+topk+fp16", "'topk' and 'fp16' in 'bsp+topk+fp16' both set compression.method"),
    ("bsp,ssp,bsp", "'bsp' is listed twice"),
    (" , ", "give at least one scheme"),
])
def test_bad_scheme_specs(text, fragment):
    with pytest.raises(ConfigError, match="--schemes") as err:
        parse_schemes(text)
    assert fragment in str(err.value)


# -- rows ---------------------------------------------------------------------------------------------------


def test_speedup_is_bsp_time_over_scheme_time_or_none():
    assert speedup(90.0, 20.0) == 4.5
    assert speedup(None, 20.0) is None and speedup(90.0, None) is None and speedup(90.0, 0.0) is None
    rows = add_speedups([{"scheme": "bsp", "time_to_target_s": 30.0}, {"scheme": "gssp", "time_to_target_s": 12.0},
                         {"scheme": "ssp", "time_to_target_s": None}])
    assert [r["speedup_vs_bsp"] for r in rows] == [1.0, 2.5, None]
    no_bsp = add_speedups([{"scheme": "bsp+topk", "time_to_target_s": 5.0}, {"scheme": "gssp", "time_to_target_s": 1.0}])
    assert [r["speedup_vs_bsp"] for r in no_bsp] == [None, None]
    unreached = add_speedups([{"scheme": "bsp", "time_to_target_s": None}, {"scheme": "gssp", "time_to_target_s": 1.0}])
    assert [r["speedup_vs_bsp"] for r in unreached] == [None, None]


def test_median_counts_unreached_seeds_as_infinitely_slow():
    assert median_time([3.0, 1.0, 2.0]) == 2.0
    assert median_time([1.0, None, 3.0]) == 3.0
    assert median_time([1.0, None, None]) is None
    assert median_time([4.0, 2.0]) == 3.0
    assert median_time([2.0, None]) is None
    assert median_time([5.0, 1.0, None, 2.0]) == 3.5
    assert median_time([None]) is None and median_time([]) is None


def test_seeds_row_holds_medians_and_each_seeds_key_fields():
    summaries = [
        {"scheme": "gssp", "backend": "sim", "target_accuracy": 0.9, "time_to_target_s": t, "final_accuracy": a,
         "best_accuracy": a, "bytes_up": b, "bytes_down": 2 * b, "iterations": 10, "elapsed_s": 5.0, "wall_s": 1.0,
         "stop_reason": "time_budget", "groups": [[0, 1]], "per_worker": []}
        for t, a, b in ((4.0, 0.91, 100), (None, 0.85, 300), (2.0, 0.95, 200))
    ]
    row = seeds_row("gssp+topk", summaries, ["gssp+topk/seed-0", "gssp+topk/seed-1", "gssp+topk/seed-2"], [7, 8, 9])
    assert row["scheme"] == "gssp+topk" and row["sync_scheme"] == "gssp"
    assert row["time_to_target_s"] == 4.0 and row["reached"] == 2
    assert row["final_accuracy"] == 0.91 and row["bytes_up"] == 200 and row["bytes_down"] == 400
    assert [s["seed"] for s in row["seeds"]] == [7, 8, 9]
    assert row["seeds"][1] == {"seed": 8, "run_dir": "gssp+topk/seed-1", "time_to_target_s": None,
                               "final_accuracy": 0.85, "best_accuracy": 0.85, "bytes_up": 300, "bytes_down": 600,
                               "iterations": 10, "elapsed_s": 5.0, "wall_s": 1.0, "stop_reason": "time_budget"}


# -- planning (everything validated before the first run) --------------------------------------------------


def test_plan_validates_every_scheme_and_seed_before_running():
    plan = plan_runs(None, parse_schemes("bsp,gssp+topk"), 2, FAST + ["run.seed=5", "sync.scheme=asp"])
    assert [(p.scheme, p.seed, p.run_dir) for p in plan] == [
        ("bsp", 5, "bsp/seed-0"), ("bsp", 6, "bsp/seed-1"),
        ("gssp+topk", 5, "gssp+topk/seed-0"), ("gssp+topk", 6, "gssp+topk/seed-1")]
    assert plan[0].cfg.sync.scheme == "bsp"  # the scheme wins over --set
    assert plan[3].cfg.compression.method == "topk" and plan[3].cfg.run.seed == 6
    # SIM needs real gradients: only the gssp+sim config is invalid, and it is named.
    with pytest.raises(ConfigError, match=r"^scheme gssp\+sim: .*compression\.similarity"):
        plan_runs(None, parse_schemes("bsp,gssp+sim"), 1, FAST + ["backend.mode=cost"])
    with pytest.raises(ConfigError, match="--seeds 0: must be at least 1"):
        plan_runs(None, parse_schemes("bsp"), 0, FAST)


def test_run_files_match_the_runner():
    from shoal.runner import RUN_FILES as runner_files

    assert RUN_FILES == runner_files


# -- end to end ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """bsp, ssp and gssp on the fast config with two speed tiers, through the real console script."""
    out = tmp_path_factory.mktemp("cmp") / "out"
    result = shoal("compare", *_sets("cluster.speeds=[1, 1, 3, 3]"), "--schemes", "bsp,ssp,gssp", "--out", str(out))
    return out, result


def test_compare_writes_rows_plots_and_report(compared):
    out, result = compared
    assert result.returncode == 0, result.stderr
    assert "report:" in result.stdout and str(out / "report.html") in result.stdout.replace("\n", "")
    data = json.loads((out / "compare.json").read_text())
    assert data["schemes"] == ["bsp", "ssp", "gssp"] and data["seeds"] == 1 and data["backend"] == "sim"
    assert data["target_accuracy"] == 0.9 and data["command"].startswith("shoal compare ")
    rows = {r["scheme"]: r for r in data["rows"]}
    assert list(rows) == ["bsp", "ssp", "gssp"]
    for name, row in rows.items():
        assert all(key in row for key in SUMMARY_FIELDS + ("speedup_vs_bsp",)), name
        assert row["run_dir"] == name and row["sync_scheme"] == name
        summary = json.loads((out / name / "summary.json").read_text())
        assert row["time_to_target_s"] == summary["time_to_target_s"] and row["iterations"] == summary["iterations"]
        bsp_t, t = rows["bsp"]["time_to_target_s"], row["time_to_target_s"]
        expected = None if bsp_t is None or t is None else round(bsp_t / t, 6)
        assert row["speedup_vs_bsp"] == expected
    assert len(rows["gssp"]["groups"]) == 2
    for name in ("accuracy.png", "time-split.png", "timeline-bsp.png", "timeline-ssp.png", "timeline-gssp.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (out / "report.html").read_text()
    for anchor in ("accuracy", "results", "timeline", "groups"):
        assert f'<section id="{anchor}">' in page
    assert '<section id="sim">' not in page and '<section id="routing">' not in page
    from shoal import __version__

    assert data["provenance"]["shoal"] == __version__ and data["provenance"]["host"]
    assert data["provenance"]["cpu"] and data["provenance"]["torch"]  # runs repeat exactly only on the same CPU kind
    assert f"torch {data['provenance']['torch']}" in page
    assert f"Made by shoal {__version__} on " in page  # the footer says which shoal made it, where and when
    # accuracy, loss and bytes, bytes against time to target, time split, and three timelines
    assert page.count('<img src="data:image/png;base64,') == 7
    assert (out / "bytes_time.png").is_file() and all(row["bytes_to_target"] for row in rows.values())
    assert "profiled" in page  # gssp's grouping is listed


def test_bad_scheme_is_one_line_exit_2_and_writes_nothing(tmp_path):
    result = shoal("compare", *_sets(), "--schemes", "bsp,gssp+warp", "--out", str(tmp_path / "c"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    modifiers = ["sim", "balance", "balance-steps", "balance-deadline", *COMPRESSORS.names(), "ina", *(f"ina-{p}" for p in PLANNERS.names())]
    assert {"dgc", "topk", "powersgd"} <= set(COMPRESSORS.names()) and {"grid", "atp", "rgria"} <= set(PLANNERS.names())
    assert result.stderr.strip().splitlines() == [
        f"error: --schemes: unknown modifier 'warp' in 'gssp+warp'; choose from {', '.join(modifiers)}"]
    assert not (tmp_path / "c").exists()


def test_an_earlier_comparison_is_never_overwritten_by_accident(compared):
    out, _ = compared
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    result = shoal("compare", *_sets(), "--schemes", "bsp", "--out", str(out))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "already holds a comparison" in result.stderr and "--overwrite" in result.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before


def test_seeds_give_medians_and_unlogged_runs_say_so(tmp_path):
    out = tmp_path / "seeds"
    args = ["compare", *_sets("backend.log_iterations=false", "run.max_time_s=0.5"), "--schemes", "ssp",
            "--seeds", "2", "--out", str(out), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "compare.json").read_text())
    assert data["seeds"] == 2
    for row in data["rows"]:
        seeds = row["seeds"]
        assert [s["seed"] for s in seeds] == [0, 1]
        assert [s["run_dir"] for s in seeds] == [f"{row['scheme']}/seed-0", f"{row['scheme']}/seed-1"]
        assert row["time_to_target_s"] == median_time([s["time_to_target_s"] for s in seeds])
        assert row["bytes_up"] == (seeds[0]["bytes_up"] + seeds[1]["bytes_up"]) / 2
        assert (out / row["scheme"] / "seed-1" / "summary.json").exists()
    page = (out / "report.html").read_text()
    assert "ssp: no per-iteration events" in page and not list(out.glob("timeline-*.png"))
    assert CliRunner().invoke(app, args).exit_code == 2
    again = CliRunner().invoke(app, args + ["--overwrite"])
    assert again.exit_code == 0, again.output


def test_report_rebuilds_the_page_from_the_folder_alone(compared, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(compared[0], out)  # the fixture's folder is shared with other tests
    (out / "report.html").unlink()
    for png in out.glob("*.png"):
        png.unlink()
    result = shoal("report", str(out))
    assert result.returncode == 0, result.stderr
    assert (out / "report.html").read_text().count("<img") >= 2


@pytest.mark.parametrize("damage, message", [
    ("nothing", "no compare.json"), ("json", "not a shoal compare result (JSONDecodeError"),
    ("run", "is missing"), ("no rows", "\"rows\" must be a non-empty list"), ("non-dict rows", "list of objects"),
    ("no schemes", "\"schemes\" must be a list"), ("truncated summary", "not a run summary (JSONDecodeError"),
])
def test_report_on_a_bad_folder_is_one_line_and_exit_2(tmp_path, damage, message):
    folder = tmp_path / "c"
    folder.mkdir()
    good = {"schemes": ["bsp"], "rows": [{"scheme": "bsp", "run_dir": "bsp"}]}
    index = {"json": None, "run": good, "no rows": {**good, "rows": []}, "non-dict rows": {**good, "rows": [1, 2]},
             "no schemes": {"rows": good["rows"]}, "truncated summary": good}.get(damage)
    if damage == "json":
        (folder / "compare.json").write_text("{not json")
    elif index is not None:
        (folder / "compare.json").write_text(json.dumps(index))
    if damage == "truncated summary":
        (folder / "bsp").mkdir()
        (folder / "bsp" / "summary.json").write_text('{"scheme": "bs')
    result = shoal("report", str(folder))
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(folder.glob("*.png")) and not (folder / "report.html").exists()  # nothing drawn
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_parallel_jobs_give_the_same_rows_and_resume_runs_only_what_is_missing(tmp_path):
    args = ["compare", *_sets("run.max_time_s=1.0"), "--schemes", "bsp,asp", "--seeds", "2", "-q"]
    one = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "one")])
    two = CliRunner().invoke(app, [*args, "--jobs", "2", "--out", str(tmp_path / "two")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output

    def seeds(folder):
        rows = json.loads((folder / "compare.json").read_text())["rows"]
        return [[(s["seed"], s["time_to_target_s"], s["final_accuracy"], s["iterations"]) for s in r["seeds"]]
                for r in rows]

    assert seeds(tmp_path / "one") == seeds(tmp_path / "two")
    kept = tmp_path / "one" / "bsp" / "seed-0" / "summary.json"
    before = kept.stat().st_mtime_ns
    (tmp_path / "one" / "asp" / "seed-1" / "summary.json").unlink()  # as if cut off during this run
    again = CliRunner().invoke(app, [*args, "--resume", "--out", str(tmp_path / "one")])
    assert again.exit_code == 0, again.output
    assert kept.stat().st_mtime_ns == before and seeds(tmp_path / "one") == seeds(tmp_path / "two")
    old_summary = kept.read_text()
    changed = CliRunner().invoke(app, [*args, "--resume", "--set", "optimizer.lr=0.05", "--out", str(tmp_path / "one")])
    assert changed.exit_code == 0 and kept.stat().st_mtime_ns != before  # another config: every run again
    aside = tmp_path / "one" / "bsp" / "seed-0.replaced-1"  # ... and none of the finished ones is lost
    assert (aside / "summary.json").read_text() == old_summary and (aside / "metrics.jsonl").is_file()
    assert json.loads((tmp_path / "one" / "compare.json").read_text())["rows"][0]["seeds"][0]["run_dir"] == "bsp/seed-0"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_stop_file_ends_the_comparison_after_the_runs_in_flight_and_resume_goes_on(tmp_path, jobs):
    """OUT/STOP, made while the first runs train: they finish (none is cut short), no other run starts, compare.json
    lists them marked interrupted, exit 130; --resume removes the file, keeps them and runs the rest."""
    import threading
    import time

    out = tmp_path / "cmp"
    args = ["compare", *_sets("run.max_time_s=1.0", "run.stop_at_target=false"), "--schemes", "bsp,asp,ssp", "-q",
            "--jobs", jobs, "--out", str(out)]

    def stop_once_a_run_trains():
        deadline = time.monotonic() + 120
        while not list(out.glob("*/metrics.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.01)
        (out / "STOP").touch()

    stopper = threading.Thread(target=stop_once_a_run_trains)
    stopper.start()
    stopped = CliRunner().invoke(app, args)
    stopper.join()
    assert stopped.exit_code == 130, stopped.output
    assert "stopped as" in stopped.output and "cut short: none in flight" in stopped.output
    finished = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/summary.json")}
    assert "ssp" not in finished and 1 <= len(finished) <= int(jobs), finished.keys()
    assert all(s["stop_reason"] == "time_budget" for s in finished.values())  # each ran to its end
    result = json.loads((out / "compare.json").read_text())
    assert result["interrupted"] is True and {r["scheme"] for r in result["rows"]} == set(finished)
    kept = {name: (out / name / "summary.json").stat().st_mtime_ns for name in finished}
    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert not (out / "STOP").exists() and "interrupted" not in json.loads((out / "compare.json").read_text())
    assert {name: (out / name / "summary.json").stat().st_mtime_ns for name in finished} == kept
    assert (out / "ssp" / "summary.json").exists()


def test_a_time_to_target_spanning_fewer_than_twenty_evaluations_is_warned_about():
    from shoal.comparison import resolution_warnings
    from shoal.config import load_config

    rows = [{"scheme": "bsp", "time_to_target_s": 10.0, "iterations": 4000},
            {"scheme": "asp", "time_to_target_s": 50.0, "iterations": 9000}, {"scheme": "ssp", "time_to_target_s": None}]
    by_time = resolution_warnings(rows, load_config(None, ["run.eval_every_s=2"]))
    assert len(by_time) == 1 and by_time[0].startswith("resolution: bsp's time to target spans 5 evaluations "
                                                       "(every 2 s)")
    by_iterations = resolution_warnings(rows, load_config(None, ["run.eval_every_iterations=250"]))
    assert [w.split("'")[0] for w in by_iterations] == ["resolution: bsp"]  # 4000 / 250 = 16 < 20; 9000 / 250 = 36


def _table_row(**changes):
    """A compare.json row as print_table reads it."""
    return {"scheme": "gssp@sync.gssp.staleness=3", "time_to_target_s": 24.0, "speedup_vs_bsp": 4.0,
            "final_accuracy": 0.96, "bytes_up": 255e6, "iterations": 1032, "seeds": [1, 2, 3], "reached": 3,
            "time_to_target_interval": {"ci95": [20.0, 28.5]}, "p_value": 0.1, "versus": "bsp", **changes}


@pytest.mark.timeout(30)
def test_a_piped_results_table_keeps_every_column_whole_and_a_row_per_line(capsys, tmp_path):
    """Piped or logged (no terminal), rich would fit the table into 80 columns and cut every header and cell."""
    from shoal.commands.compare import print_table

    print_table({"target_accuracy": 0.95, "seeds": 3, "backend": "sim", "rows": [_table_row()]},
                tmp_path / "report.html")
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "scheme" in line)
    for column in ("time to 95%", "95% interval", "reached", "vs BSP", "final accuracy", "upload", "iterations"):
        assert column in header, header
    assert any("gssp@sync.gssp.staleness=3" in line and "20.0s..28.5s" in line and "1,032" in line for line in lines)
    assert "95% interval: a bootstrap interval of the median, from 5 seeds on (--seeds)" in lines  # 3 seeds here


@pytest.mark.timeout(30)
def test_the_table_explains_a_missing_interval_only_when_seeds_are_too_few(capsys, tmp_path):
    from shoal.commands.compare import print_table

    print_table({"target_accuracy": 0.95, "seeds": 5, "backend": "sim",
                 "rows": [_table_row(seeds=[0, 1, 2, 3, 4], reached=5)]}, tmp_path / "report.html")
    assert "bootstrap" not in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_a_logged_comparison_says_each_finished_run_on_one_line(capsys):
    """A study's log is read with grep: every finished run is one line, however long, not wrapped at 80 columns."""
    from types import SimpleNamespace

    from shoal.comparison.execute import RunsProgress

    run = SimpleNamespace(scheme="streaming_diloco@sync.streaming_diloco.outer_quantization=fp4", tuning=True,
                          point=(("sync.streaming_diloco.outer_lr", 0.7),), run_dir="x/tune/y/seed-1", seed=1)
    summary = {"time_to_target_s": 32.9, "final_accuracy": 0.876, "iterations": 8160, "wall_s": 1113.0}
    with RunsProgress(1, quiet=False) as progress:
        progress.end(run, summary)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert any(line.startswith("done streaming_diloco@") and line.endswith("8160 iterations, wall 1113s; 1/1 runs")
               for line in lines), lines


@pytest.mark.timeout(30)
def test_each_finished_run_says_how_long_the_rest_will_take_at_the_mean_run_so_far(capsys):
    """Runs kept by --resume took no time here, so they do not count; the rest run ``jobs`` at a time."""
    from types import SimpleNamespace

    from shoal.comparison.execute import RunsProgress

    run = SimpleNamespace(scheme="bsp", tuning=False, point=(), run_dir="bsp/seed-0", seed=0)
    with RunsProgress(8, quiet=False, jobs=2) as progress:
        progress.end(run, {"time_to_target_s": 1.0, "final_accuracy": 0.9, "iterations": 10, "wall_s": 5000.0},
                     reused=True)
        progress.end(run, {"time_to_target_s": 1.0, "final_accuracy": 0.9, "iterations": 10, "wall_s": 600.0})
        progress.end(run, {"time_to_target_s": None, "final_accuracy": 0.5, "iterations": 10, "wall_s": 1200.0})
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].endswith("wall 5000s; 1/8 runs")  # nothing run here yet: no guess
    assert lines[1].endswith("wall 600s; 2/8 runs, about 30 min left")  # 6 left, 3 rounds of 2 at 600 s
    assert lines[2].endswith("wall 1200s; 3/8 runs, about 45 min left")  # 5 left, 3 rounds at 900 s
