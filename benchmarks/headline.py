"""The README's evidence tables, rendered from the study results files, so that the README quotes exactly what
committed code measured and cannot fall behind a rerun (the test suite checks it).

Usage:
    .venv/bin/python benchmarks/headline.py            # print the tables
    .venv/bin/python benchmarks/headline.py --write    # put them into README.md, between its two markers
    .venv/bin/python benchmarks/headline.py --check    # exit 1 with one line if README.md says something else

One table per study results file (benchmarks/results/): the heterogeneity studies first (balance.py; an
evidence.py study only where no balance study shares its runs, since the balance study holds every row of it),
then the low-communication studies (lowcomm.py, with each row's bytes to target). Rows are ordered by median
time to target; each row's verdict is against the study's best baseline (wins or loses where the Mann-Whitney
p is under 0.05, else ties), and the study's own answers follow its table.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import balance
import evidence
import lowcomm
from tuned import RESULTS, ROOT

README = ROOT / "README.md"
START = "<!-- evidence tables: written by benchmarks/headline.py from benchmarks/results/, do not edit by hand -->"
END = "<!-- end of the evidence tables -->"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite README.md's evidence tables")
    action.add_argument("--check", action="store_true", help="exit 1 if README.md's tables are not these")
    args = parser.parse_args(argv)
    text = render()
    if not (args.write or args.check):
        print(text, end="")
        return 0
    try:
        readme = README.read_text()
        start, end = marked_span(readme)
    except (OSError, ValueError) as err:
        print(f"headline: {err}", file=sys.stderr)
        return 2
    if args.check:
        if readme[start:end] != text:
            print("headline: README.md's evidence tables differ from benchmarks/results/; run "
                  "`.venv/bin/python benchmarks/headline.py --write`", file=sys.stderr)
            return 1
        return 0
    README.write_text(readme[:start] + text + readme[end:])
    return 0


def marked_span(readme: str) -> tuple[int, int]:
    """Where the tables go: from the line after the start marker to the end marker's line (ValueError naming
    what is wrong)."""
    for marker in (START, END):
        if readme.count(marker) != 1:
            raise ValueError(f"README.md must hold the line {marker!r} exactly once")
    start, end = readme.index(START) + len(START) + 1, readme.index(END)
    if end < start:
        raise ValueError("README.md's end marker comes before its start marker")
    return start, end


def studies() -> list[tuple[str, dict[str, Any]]]:
    """(script, record) of every study results file to quote, in the order they are shown."""
    def load(prefix: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(RESULTS.glob(f"{prefix}-*.json"))]

    balanced = load("balance")
    shared = {balance.STUDIES[r["study"]]["folder"] for r in balanced if r["study"] in balance.STUDIES}
    alone = [r for r in load("evidence") if r["study"] not in shared]
    return ([("balance", r) for r in balanced] + [("evidence", r) for r in alone]
            + [("lowcomm", r) for r in load("lowcomm")])


def render() -> str:
    """Every study's table and answers, as markdown."""
    lines = [""]  # a blank line after the start marker and before the end marker: the tables are their own blocks
    for script, record in studies():
        lines += study_lines(script, record) + [""]
    return "\n".join(lines) + "\n"


def study_lines(script: str, record: dict[str, Any]) -> list[str]:
    """One study: where it comes from and its protocol, its table, its answers."""
    compare, name = record["compare"], record["study"]
    rows = sorted(compare["rows"], key=lambda r: (r["time_to_target_s"] is None, r["time_to_target_s"] or 0.0))
    best = next((r for r in rows if r["scheme"] == r.get("versus")), None)
    lines = [f"**{record['title'][:1].upper() + record['title'][1:]}** (`benchmarks/{script}.py {name}`, "
             f"[results](benchmarks/results/{script}-{name}.md), code {record['git_commit'][:7]}): "
             f"{protocol(compare)}; p: two-sided Mann-Whitney U against the best baseline"
             f"{'' if best is None else ', ' + best['scheme']}.", ""]
    lines += table_lines(rows, compare.get("grids", {}), best, with_bytes=script == "lowcomm")
    front = RESULTS / f"{script}-{name}-pareto.png"  # lowcomm.py draws the bytes-against-time plane beside its file
    if front.exists():
        lines += ["", f"![{script} {name}: bytes against time to target, every seed and the medians]"
                      f"(benchmarks/results/{front.name})"]
    if any(at_edge(row, compare.get("grids", {})) for row in rows):
        lines += ["", "*edge*: the kept value is the smallest or largest of the scheme's grid (every scheme's grid "
                      "has as many points): its best may lie beyond, so the row may be under-tuned. How steep the "
                      "curve is there, as median time to target on the development seeds, the kept end first and "
                      "the next value in second (a small gap: a flat stretch, which a wider grid is unlikely to "
                      "move): " + edge_words(rows, compare.get("grids", {})) + "."]
        lines += beyond_words(script, name)
    if answers := record.get("answers"):
        lines += [""] + (lowcomm.answer_lines(answers) if script == "lowcomm"
                         else balance.answer_lines(answers, compare["metric"]))
    while lines[-1] == "":
        lines.pop()
    return lines


def table_lines(rows: list[dict[str, Any]], grids: dict[str, Any], best: dict[str, Any] | None,
                with_bytes: bool) -> list[str]:
    """The rows as a markdown table; ``with_bytes`` adds bytes to target and how many times fewer than BSP's."""
    bsp_bytes = next((r.get("bytes_to_target") for r in rows if r["scheme"] == "bsp"), None)
    lines = ["| scheme | kept point | median time to target (s) | 95% interval | reached |"
             + (" bytes to target | fewer bytes than BSP |" if with_bytes else "") + " p | verdict |",
             "|---|---|---:|---|---:|" + ("---:|---:|" if with_bytes else "") + "---:|---|"]
    for row in rows:
        iv = (row.get("time_to_target_interval") or {}).get("ci95")
        cells = [f"`{row['scheme']}`", kept_point(row, grids), _seconds(row["time_to_target_s"]),
                 "-" if not iv else f"{_seconds(iv[0])}..{_seconds(iv[1])}",
                 f"{row.get('reached', 0)}/{len(row.get('seeds', []))}"]
        if with_bytes:
            mine = row.get("bytes_to_target")
            cells += [lowcomm._bytes(mine), "-" if not mine or bsp_bytes is None else f"{bsp_bytes / mine:.2f}x"]
        p = row.get("p_value")
        cells += ["-" if p is None else f"{p:.2g}", verdict(row, best)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def kept_point(row: dict[str, Any], grids: dict[str, Any]) -> str:
    """The tuned values the row kept, each marked *edge* when it is an end of its grid (compare's warning)."""
    edges = {key for key, _, _ in _edges(row, grids)}
    return evidence._point({key: f"{value} *edge*" if key in edges else value
                            for key, value in (row.get("tuned") or {}).items()})


def edge_words(rows: list[dict[str, Any]], grids: dict[str, Any]) -> str:
    """Each edge row's kept end against the next value in, on the development seeds, in one phrase each."""
    from shoal.report.tuning import edge_margins

    phrases = []
    for row in rows:
        for m in edge_margins(row, grids):
            gap = "" if None in (m["kept_s"], m["next_s"]) else ", " + _percent(m["next_s"] / m["kept_s"] - 1)
            phrases.append(f"`{row['scheme']}` {m['key'].rsplit('.', 1)[-1]} {m['kept']}: {_seconds(m['kept_s'])} s, "
                           f"{m['next']}: {_seconds(m['next_s'])} s{gap}")
    return "; ".join(phrases)


def beyond_words(script: str, name: str) -> list[str]:
    """What one step past each kept end did on the development seeds (benchmarks/grid_edges.py), where that
    check has run for the study's folder."""
    folder = {"evidence": evidence.STUDIES, "balance": balance.STUDIES, "lowcomm": lowcomm.STUDIES}[script][name]
    path = RESULTS / f"grid_edges-{folder['folder']}.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    phrases = [f"`{r['scheme']}` {r['key'].rsplit('.', 1)[-1]} {r['beyond']}: {_seconds(r['beyond_s'])} s"
               + ("" if None in (r["beyond_s"], r["kept_s"]) else f", {_percent(r['beyond_s'] / r['kept_s'] - 1)}")
               for r in rows]
    moved = [r["scheme"] for r in rows if r["kept_would_move"]]
    verdict = ("every kept value stands" if not moved else
               f"would move on the development seeds: {', '.join(f'`{m}`' for m in moved)}")
    return ["", f"One step past each kept end, on the same development seeds (`benchmarks/grid_edges.py "
                f"{folder['folder']}`, [results](benchmarks/results/grid_edges-{folder['folder']}.md)): "
                + "; ".join(phrases) + f". So {verdict}."]


def _percent(change: float) -> str:
    """A relative change with its sign, one decimal under 10%."""
    return f"{100 * change:+.1f}%" if abs(change) < 0.1 else f"{100 * change:+.0f}%"


def at_edge(row: dict[str, Any], grids: dict[str, Any]) -> bool:
    return bool(_edges(row, grids))


def _edges(row: dict[str, Any], grids: dict[str, Any]) -> list[tuple[str, Any, str]]:
    from shoal.report.tuning import grid_edges

    return grid_edges(grids.get(row["scheme"], {}), row.get("tuned") or {})


def protocol(compare: dict[str, Any]) -> str:
    """The target and the seeds, in words."""
    metric, target = compare["metric"], compare.get("target")
    goal = f"{metric} <= {target}" if metric != "accuracy" else f"accuracy >= {compare['target_accuracy']}"
    tuning = compare.get("tuning_seeds") or []
    evals = compare["eval_seeds"]
    tuned = f"tuned on development seeds {_span(tuning)}" if tuning else "nothing to tune"
    return (f"target {goal}; {tuned}; medians over evaluation seeds {_span(evals)} ({len(evals)}), "
            f"in virtual seconds")


def verdict(row: dict[str, Any], best: dict[str, Any] | None) -> str:
    """evidence.verdict with the ratio of medians (best baseline's over this row's) where the difference counts."""
    said = evidence.verdict(row, best)
    mine, theirs = row.get("time_to_target_s"), (best or {}).get("time_to_target_s")
    if said in ("wins", "loses") and mine and theirs:
        return f"{'**wins**' if said == 'wins' else 'loses'}, {theirs / mine:.2f}x"
    return said


def _span(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
