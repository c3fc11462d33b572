"""A run's metrics.jsonl as a Chrome / Perfetto trace: one track per worker and per group server.

The trace is the Trace Event Format's JSON object form (``traceEvents``,
times in microseconds), which ui.perfetto.dev and chrome://tracing open.
Each iteration record ends at its ``t`` and is laid out backwards in the
order a worker runs it: gate wait, pull, compute, push (``pull_s`` splits
the communication time; records without it show one "pull+push" slice after
compute). Group servers get an instant per exchange; the run track gets the
test metric and the learning rate as counters and an instant per grouping,
failure, checkpoint, learning-rate decay and speed change, and the
straggler verdict at the end.
Pure: records in, a dict out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shoal.config.sections import RATE_EVENTS

RUN, WORKERS, SERVERS = 0, 1, 2
#: run-level events drawn as global instants on the run track
MARKS = ("groups", "worker_failed", "worker_restarted", "checkpoint", "resume", "lr_decay", "speed_change", "end")
#: events that carry the learning rate from then on, drawn as a counter on the run track
RATE_CHANGES = ("start", *RATE_EVENTS)


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict[str, Any]:
    event: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _slice(name: str, start: float, dur: float, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": "iteration", "ph": "X", "ts": _us(start), "dur": max(_us(dur), 0),
            "pid": WORKERS, "tid": tid, "args": args}


def iteration_slices(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The slices of one iteration record (wait, pull, compute, push), ending at its ``t``."""
    w = int(record["worker"])
    wait, compute, comm = (float(record.get(k) or 0.0) for k in ("wait_s", "compute_s", "comm_s"))
    args = {k: record[k] for k in ("group", "clock", "staleness", "loss") if record.get(k) is not None}
    if record.get("pull_s") is None:
        phases = [("wait", wait), ("compute", compute), ("pull+push", comm)]
    else:
        pull = float(record["pull_s"])
        phases = [("wait", wait), ("pull", pull), ("compute", compute), ("push", max(comm - pull, 0.0))]
    start = float(record["t"]) - sum(d for _, d in phases)
    slices = []
    for name, dur in phases:
        if dur > 0:
            slices.append(_slice(name, start, dur, w, args))
        start += dur
    return slices


def _mark(record: dict[str, Any]) -> dict[str, Any]:
    kind = record["event"]
    label = f"{kind}: {record['reason']}" if kind in ("groups", "end") and "reason" in record else kind
    args = {k: v for k, v in record.items() if k not in ("event", "t")}
    return {"name": label, "cat": kind, "ph": "i", "s": "g", "ts": _us(float(record["t"])), "pid": RUN, "tid": 0,
            "args": args}


def build_trace(records: Iterable[dict[str, Any]], title: str = "shoal run",
                stragglers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace of a run's records (the lines of metrics.jsonl, in order); ``stragglers`` (summary.json's):
    its verdict marks the end of the run track and goes into the trace's metadata."""
    events: list[dict[str, Any]] = []
    workers: set[int] = set()
    servers: set[int] = set()
    iterations = 0
    for record in records:
        kind = record.get("event")
        if kind == "iteration":
            iterations += 1
            workers.add(int(record["worker"]))
            events.extend(iteration_slices(record))
        elif kind == "exchange":
            group = int(record.get("group", 0))
            servers.add(group)
            events.append({"name": "exchange", "cat": "exchange", "ph": "i", "s": "t", "ts": _us(float(record["t"])),
                           "pid": SERVERS, "tid": group, "args": {"bytes": record.get("bytes")}})
        elif kind == "eval":
            value = record.get("value", record.get("accuracy"))
            if value is not None:
                events.append({"name": record.get("metric", "accuracy"), "ph": "C", "ts": _us(float(record["t"])),
                               "pid": RUN, "tid": 0, "args": {record.get("metric", "accuracy"): value}})
        if kind in RATE_CHANGES and "lr" in record and "t" in record:  # the start, each decay and each stair
            events.append({"name": "learning rate", "ph": "C", "ts": _us(float(record["t"])), "pid": RUN, "tid": 0,
                           "args": {"lr": record["lr"]}})
        if kind in MARKS and "t" in record:
            events.append(_mark(record))
    if stragglers and stragglers.get("verdict"):
        end = max((e["ts"] for e in events if "ts" in e), default=0)
        events.append({"name": f"stragglers: {stragglers['verdict']}", "cat": "stragglers", "ph": "i", "s": "g",
                       "ts": end, "pid": RUN, "tid": 0, "args": {k: v for k, v in stragglers.items()
                                                                  if k in ("culprit", "verdict", "without_culprit")}})
    meta = [_meta(RUN, None, "process_name", title), _meta(RUN, 0, "thread_name", "run"),
            _meta(WORKERS, None, "process_name", "workers"), _meta(SERVERS, None, "process_name", "group servers")]
    meta += [_meta(WORKERS, w, "thread_name", f"worker {w}") for w in sorted(workers)]
    meta += [_meta(SERVERS, g, "thread_name", f"group server {g}") for g in sorted(servers)]
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": WORKERS, "tid": w, "args": {"sort_index": w}}
             for w in sorted(workers)]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "iterations": iterations, "workers": len(workers),
                          **({"stragglers": stragglers["verdict"]} if stragglers and stragglers.get("verdict") else {})}}
