"""Finished study runs kept in git, so that a study longer than one session goes on from where it stopped on a
fresh checkout.

runs/ is not tracked, and the evidence studies take many hours (benchmarks/studies.sh). Each finished run of
runs/evidence is packed, its small files only (config.toml, summary.json, metrics.jsonl: the studies log no
iteration events; not the model), into benchmarks/archive/FOLDER/RUN.tar.gz, byte for byte the same whenever
the run is the same, so that packing again changes nothing in git. Unpacking puts a run back where compare's
``--resume`` finds it (the same config by value: it is read, not run again) and never replaces a run already
there.

Usage:
    .venv/bin/python benchmarks/run_archive.py save      # pack every finished run not packed yet (or changed)
    .venv/bin/python benchmarks/run_archive.py restore   # unpack every packed run whose folder lacks one
    .venv/bin/python benchmarks/run_archive.py --list    # the packed runs per study folder

A packed run is data from the code of its time: its summary.json records that code (``code``: the commit, and
whether src/ had uncommitted changes; older runs lack it), the results file that uses it
records the commit it was written at, and compare reuses a run only when its config is the same by value.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import tarfile
from collections import Counter
from pathlib import Path

from shoal.comparison.execute import UNFINISHED  # a run compare's --resume would run again is not kept

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "evidence"
ARCHIVE = ROOT / "benchmarks" / "archive"
#: what a study needs of a run: compare's --resume reads the first two, lowcomm's quality at target the third
KEPT = ("config.toml", "summary.json", "metrics.jsonl")


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that ended (target, time or iteration limit, divergence): one to keep."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return summary.get("stop_reason") not in UNFINISHED and all((run_dir / name).is_file() for name in KEPT)


def pack(run_dir: Path) -> bytes:
    """The run's kept files as a gzipped tar with no times, owners or modes: the same run, the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in KEPT:
            data = (run_dir / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def archive_path(run_dir: Path, runs: Path = RUNS, archive: Path = ARCHIVE) -> Path:
    return archive / run_dir.relative_to(runs).parent / f"{run_dir.name}.tar.gz"


def save(runs: Path = RUNS, archive: Path = ARCHIVE) -> tuple[int, int]:
    """Pack every finished run under ``runs`` whose archive is missing or differs: (written, unchanged)."""
    written = unchanged = 0
    for summary in sorted(runs.glob("**/summary.json")):
        run_dir = summary.parent
        if not finished(run_dir):
            continue
        data, path = pack(run_dir), archive_path(run_dir, runs, archive)
        if path.is_file() and path.read_bytes() == data:
            unchanged += 1
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
        written += 1
    return written, unchanged


def restore(runs: Path = RUNS, archive: Path = ARCHIVE) -> tuple[int, int]:
    """Unpack every packed run whose folder under ``runs`` holds no summary.json: (restored, kept as they were)."""
    restored = kept = 0
    for path in sorted(archive.glob("**/*.tar.gz")):
        run_dir = runs / path.relative_to(archive).parent / path.name.removesuffix(".tar.gz")
        if (run_dir / "summary.json").exists():
            kept += 1
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "r:gz") as tar:
            for member in tar.getmembers():
                if member.name not in KEPT or not member.isfile():
                    print(f"error: {path}: holds {member.name!r}, not a run archive's files", file=sys.stderr)
                    raise SystemExit(2)
            for member in sorted(tar.getmembers(), key=lambda m: m.name == "summary.json"):  # summary last
                (run_dir / member.name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
        restored += 1
    return restored, kept


def listing(archive: Path = ARCHIVE) -> Counter[str]:
    """How many runs are packed per study folder."""
    return Counter(p.relative_to(archive).parts[0] for p in archive.glob("**/*.tar.gz"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", nargs="?", choices=["save", "restore"])
    parser.add_argument("--list", action="store_true", help="the packed runs per study folder")
    args = parser.parse_args(argv)
    if args.list or args.action is None:
        for folder, count in sorted(listing().items()):
            print(f"{folder}: {count} runs")
        return
    if args.action == "save":
        written, unchanged = save() if RUNS.is_dir() else (0, 0)
        print(f"packed {written} runs into {ARCHIVE.relative_to(ROOT)} ({unchanged} already there)")
    else:
        restored, kept = restore()
        print(f"unpacked {restored} runs into {RUNS.relative_to(ROOT)} ({kept} already there)")


if __name__ == "__main__":
    main(sys.argv[1:])
