"""Training through faults and churn on the ray backend: the same run with and without a churn schedule.

Each run is ``shoal train --backend ray`` as a user starts it (a subprocess
of the CLI), on examples/mnist_tiers.toml under GSSP (8 workers at 1/1/2/2/
4/4/8/8x plus transient stragglers, target 94%). This script only watches
its metrics.jsonl (run time, worker and server process ids) and acts on the
schedule, in run seconds:

- ``kill -9`` worker 1 (a 1x worker; no restart: its group goes on without it),
- ``kill -STOP`` worker 3 (2x; evicted after ``backend.worker_timeout_s``),
  ``kill -CONT`` it later (it rejoins),
- two workers join (``cluster.membership``: one at 1x, one at 4x),
- ``kill -9`` group server 1 (a warm standby takes over from a peer group's replica).

Reported per seed and as medians: time to target with and without churn and
their ratio (the bar: at most 1.5x), hangs (a run that outlived its time
budget by a minute), crashes (a non-zero exit or no summary.json), the
failures the summary names and the gradients the dead server took with it.

Usage: .venv/bin/python benchmarks/churn.py [--seeds 5] [--parts kill-worker,stop,join,kill-server] [--render]
Writes benchmarks/results/churn.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuned import RESULTS, ROOT, provenance, write_results

CONFIG = ROOT / "examples" / "mnist_tiers.toml"
TARGET = 0.94
BUDGET_S = 120.0
HANG_MARGIN_S = 60.0
BASE = [
    "sync.scheme=gssp", f"run.target_accuracy={TARGET}", f"run.max_time_s={BUDGET_S}", "backend.name=ray",
    "backend.cpus_per_worker=0.25", "backend.cpus_per_server=0.25", "backend.checkpoint_every_s=0",
    "backend.worker_timeout_s=3", "backend.standby_servers=1",
]
JOIN_AT_S = 8.0
MEMBERSHIP = f"cluster.membership=[{{at_s={JOIN_AT_S:g}, add=2, speeds=[1, 4]}}]"
# (run second, action, target): the faults this script injects
SCHEDULE = [
    (4.0, "kill", ("worker", 1)),
    (6.0, "stop", ("worker", 3)),
    (10.0, "kill", ("server", 1)),
    (12.0, "cont", ("worker", 3)),
]
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}


class Watcher:
    """Follows a run's metrics.jsonl: the newest run time, the worker and server process ids."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.t = path, 0, 0.0
        self.workers: dict[int, int] = {}
        self.servers: list[int] = []

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                self._read(json.loads(line))

    def _read(self, event: dict[str, Any]) -> None:
        self.t = max(self.t, float(event.get("t") or 0.0))
        if event["event"] == "start":
            self.workers = {int(w): pid for w, pid in event["pids"].items()}
        elif event["event"] == "servers":
            self.servers = list(event["pids"])

    def pid(self, kind: str, index: int) -> int | None:
        if kind == "worker":
            return self.workers.get(index)
        return self.servers[index] if index < len(self.servers) else None


PARTS = ("kill-worker", "stop", "join", "kill-server")


def _schedule(parts: tuple[str, ...]) -> list[tuple[float, str, tuple[str, int]]]:
    """The part of SCHEDULE that ``parts`` names ("stop" includes its SIGCONT)."""
    def part(action: str, kind: str) -> str:
        return {"kill": f"kill-{kind}", "stop": "stop", "cont": "stop"}[action]
    return [item for item in SCHEDULE if part(item[1], item[2][0]) in parts]


def run(seed: int, churn: bool, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """One `shoal train` run; with ``churn`` the membership change and the schedule above (``parts`` of it)."""
    out = Path(tempfile.mkdtemp(prefix="shoal-churn-")) / "run"
    joins = churn and "join" in parts
    overrides = [*BASE, f"run.seed={seed}", *([MEMBERSHIP] if joins else [])]
    command = [str(ROOT / ".venv" / "bin" / "shoal"), "train", "--config", str(CONFIG), "--out", str(out)]
    for item in overrides:
        command += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    watcher, todo, done, stopped = Watcher(out / "metrics.jsonl"), _schedule(parts) if churn else [], [], set()
    hang = False
    try:
        while proc.poll() is None:
            if time.monotonic() - start > BUDGET_S + HANG_MARGIN_S + 60:  # start-up included
                hang = True
                break
            watcher.poll()
            while todo and watcher.t >= todo[0][0]:
                at, action, (kind, index) = todo.pop(0)
                pid = watcher.pid(kind, index)
                if pid is not None:
                    os.kill(pid, SIGNALS[action])
                    stopped.add(pid) if action == "stop" else stopped.discard(pid)
                done.append({"at_s": at, "seen_s": round(watcher.t, 3), "action": action, "target": f"{kind} {index}",
                             "pid": pid})
            time.sleep(0.1)
    finally:
        for pid in stopped:  # never leave a stopped process behind
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    stderr = proc.stderr.read() if proc.stderr else ""
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    crash = proc.returncode != 0 or summary is None
    result = {"seed": seed, "churn": churn, "exit_code": proc.returncode, "hang": hang, "crash": crash,
              "wall_s": round(time.monotonic() - start, 1), "actions": done, "out": str(out)}
    if crash:
        result["stderr_tail"] = stderr[-2000:]
    if summary is not None:
        failures = summary.get("failures", [])
        result |= {
            "time_to_target_s": summary["time_to_target_s"], "final_accuracy": summary["final_accuracy"],
            "stop_reason": summary["stop_reason"], "iterations": summary["iterations"],
            "groups": summary["groups"], "failures": failures,
            "gradients_lost": sum(f.get("gradients_lost", 0) for f in failures),
            "joiner_iterations": [p["iterations"] for p in summary["per_worker"] if p["id"] >= 8],
            "rejoined": [f["worker"] for f in failures if "rejoined_t" in f],
        }
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    calm = {r["seed"]: r for r in runs if not r["churn"]}
    churned = {r["seed"]: r for r in runs if r["churn"]}
    ratios = []
    for seed, r in churned.items():
        base = calm.get(seed, {}).get("time_to_target_s")
        if r.get("time_to_target_s") and base:
            ratios.append(r["time_to_target_s"] / base)
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    return {
        "hangs": sum(r["hang"] for r in runs), "crashes": sum(r["crash"] for r in runs),
        "reached_churn": sum(bool(r.get("time_to_target_s")) for r in churned.values()),
        "reached_calm": sum(bool(r.get("time_to_target_s")) for r in calm.values()),
        "median_time_to_target_calm_s": med([r["time_to_target_s"] for r in calm.values() if r.get("time_to_target_s")]),
        "median_time_to_target_churn_s": med([r["time_to_target_s"] for r in churned.values()
                                              if r.get("time_to_target_s")]),
        "ratios": [round(x, 3) for x in ratios], "median_ratio": med(ratios), "max_ratio": round(max(ratios), 3) if ratios else None,
        "gradients_lost": [r.get("gradients_lost") for r in churned.values()],
    }


def _median_interval(values: list[float], draws: int = 10_000) -> tuple[float | None, float | None]:
    """A 90% bootstrap interval of the median (seeded, so the table repeats)."""
    if not values:
        return None, None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return round(medians[int(0.05 * draws)], 3), round(medians[int(0.95 * draws) - 1], 3)


def _seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# Training through churn on the ray backend", "",
        f"`shoal train --backend ray` on examples/mnist_tiers.toml, GSSP, target {TARGET:.0%}, "
        f"`backend.worker_timeout_s = 3`, `backend.standby_servers = 1` (both runs); "
        f"commit `{result['git_commit'][:10]}`; command: `{result['command']}`; "
        f"{result['machine']['cpus']} cores, load average before {result['machine']['load']}.", "",
        "Schedule (run seconds): " + "; ".join(
            [f"{a['action']} {a['target']} at {a['at_s']:g}" for a in result["schedule"]]
            + ([f"two workers join (1x, 4x) at {JOIN_AT_S:g}"] if "join" in result["parts"] else [])) + ".", "",
        "| seed | time to target, no churn (s) | with churn (s) | ratio | failures named | gradients lost "
        "| rejoined | joiners' iterations | hang | crash |",
        "|---:|---:|---:|---:|---|---:|---|---|---|---|",
    ]
    calm = {r["seed"]: r for r in result["runs"] if not r["churn"]}
    for r in (r for r in result["runs"] if r["churn"]):
        base = calm.get(r["seed"], {})
        a, b = base.get("time_to_target_s"), r.get("time_to_target_s")
        named = ", ".join(f"worker {f['worker']}" if "worker" in f else f"server {f['server']}"
                          for f in r.get("failures", []))
        ratio = f"{b / a:.2f}" if a and b else "-"
        lines.append(f"| {r['seed']} | {_seconds(a)} | {_seconds(b)} | {ratio} | {named or '-'} "
                     f"| {r.get('gradients_lost')} | {r.get('rejoined')} | {r.get('joiner_iterations')} "
                     f"| {'yes' if r['hang'] else 'no'} | {'yes' if r['crash'] else 'no'} |")
    low, high = _median_interval(s["ratios"])
    lines += ["", f"Medians: {s['median_time_to_target_calm_s']} s without churn, {s['median_time_to_target_churn_s']} s "
              f"with churn; ratio median {s['median_ratio']} (90% bootstrap interval {low}..{high}), "
              f"max {s['max_ratio']} (bar: 1.5). "
              f"Hangs {s['hangs']}, crashes {s['crashes']} over {len(result['runs'])} runs; "
              f"target reached {s['reached_churn']}/{len(calm)} with churn, {s['reached_calm']}/{len(calm)} without.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--render", action="store_true", help="re-write the .md from the existing .json (no runs)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"which faults to inject (an ablation writes churn-PARTS.*): {','.join(PARTS)}")
    args = parser.parse_args()
    parts = tuple(p for p in args.parts.split(",") if p)
    if not set(parts) <= set(PARTS):
        parser.error(f"--parts: choose from {','.join(PARTS)}")
    name = "churn" if parts == PARTS else "churn-" + "+".join(parts)
    if args.render:
        (RESULTS / f"{name}.md").write_text(markdown(json.loads((RESULTS / f"{name}.json").read_text())))
        return
    load = os.getloadavg()[0]
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for churn in (False, True):  # side by side: each seed's pair runs back to back
            runs.append(run(seed, churn, parts))
            print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("failures", "actions")}), flush=True)
    result = {**provenance(), "machine": {"cpus": os.cpu_count(), "load": round(load, 2)},
              "schedule": [{"at_s": a, "action": b, "target": f"{k} {i}"} for a, b, (k, i) in _schedule(parts)],
              "membership": MEMBERSHIP if "join" in parts else None, "parts": list(parts), "runs": runs,
              "summary": summarise(runs)}
    write_results(name, result, markdown(result))
    sys.exit(0)


if __name__ == "__main__":
    main()
