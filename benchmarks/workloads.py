"""The workloads, measured: the stdlib language model's curve and cost, and how hard the shapes stand-in is.

1. ``lm``: ``shoal train --config examples/stdlib_lm.toml`` (16 workers,
   BSP, sim) as documented: wall time on this machine, iterations and
   virtual time to the target, the held-out curve in bits per byte.
2. ``shapes``: the BN image stand-in's difficulty: a linear probe on pixels
   (logistic regression, scikit-learn), and the curves of LeNet-5 and of the
   CIFAR-style ResNet-18 (width 16, batch norm) trained on one worker, with
   the iterations each needs to reach 60% and 80% test accuracy.

Usage: .venv/bin/python benchmarks/workloads.py [lm|shapes ...] (none: both; --render: rewrite the markdown and the
file's provenance from the JSON, measuring nothing)
Writes benchmarks/results/workloads.{json,md} and workloads-{lm,shapes}.png (the parts measured before are kept).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuned import RESULTS, ROOT, provenance, write_results

SHAPES_SAMPLES = 25_000  # 20,000 to train, 5,000 to test
STEPS, EVERY = 3000, 150


def measure_lm() -> dict[str, Any]:
    """The example config as a user runs it."""
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(ROOT / "examples" / "stdlib_lm.toml", [])
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        summary = train(cfg, Path(tmp) / "run")
        wall = time.perf_counter() - start
        evals = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
                 if '"eval"' in line]
    curve = [(e["iterations"], e["t"], e["value"]) for e in evals if e["event"] == "eval"]
    return {"wall_s": round(wall, 1), "time_to_target_s": summary["time_to_target_s"],
            "target": summary["target"], "iterations": summary["iterations"], "params": summary["params"],
            "final_bits_per_byte": summary["final_metric"], "stop_reason": summary["stop_reason"], "curve": curve}


def measure_shapes() -> dict[str, Any]:
    """Linear probe, and one-worker curves of LeNet-5 and ResNet-18 (width 16) on the stand-in."""
    from shoal.data import load_dataset

    ds = load_dataset("shapes", seed=0, test_fraction=0.2, synthetic_samples=SHAPES_SAMPLES)
    return {"train": len(ds.y_train), "test": len(ds.y_test), "linear_probe": linear_probe(ds),
            "lenet5": curve(ds, "lenet5", {}), "resnet18_w16": curve(ds, "resnet18", {"width": 16})}


def linear_probe(ds: Any) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression

    x, x_test = ds.x_train.flatten(1).numpy(), ds.x_test.flatten(1).numpy()
    probe = LogisticRegression(max_iter=300, C=0.05).fit(x, ds.y_train.numpy())
    return {"train_accuracy": round(probe.score(x, ds.y_train.numpy()), 4),
            "test_accuracy": round(probe.score(x_test, ds.y_test.numpy()), 4)}


def curve(ds: Any, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Adam (lr 0.002), batch 32, one worker: test accuracy every EVERY steps on the whole test set."""
    import torch
    import torch.nn.functional as F

    from shoal.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(name, ds.input_shape, ds.num_classes, options=options)
    opt = torch.optim.Adam(model.parameters(), lr=0.002)
    draw = torch.Generator().manual_seed(0)
    points, start = [], time.perf_counter()
    for step in range(1, STEPS + 1):
        idx = torch.randint(0, len(ds.y_train), (32,), generator=draw)
        model.train()
        loss = F.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % EVERY == 0:
            model.eval()
            with torch.no_grad():
                right = sum(int((model(ds.x_test[i:i + 500]).argmax(1) == ds.y_test[i:i + 500]).sum())
                            for i in range(0, len(ds.y_test), 500))
            points.append((step, right / len(ds.y_test)))
    first = lambda level: next((s for s, a in points if a >= level), None)  # noqa: E731
    return {"curve": points, "steps_to_60": first(0.6), "steps_to_80": first(0.8),
            "params": sum(p.numel() for p in model.parameters()),
            "ms_per_step": round(1000 * (time.perf_counter() - start) / STEPS, 1)}


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "lm" in results:
        lm = results["lm"]
        fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
        ax.plot([i for i, _, _ in lm["curve"]], [v for _, _, v in lm["curve"]], marker=".")
        ax.axhline(lm["target"], color="#999", linestyle=":", label=f"target {lm['target']} bits per byte")
        ax.set_xlabel("worker iterations (16 workers, BSP)")
        ax.set_ylabel("held-out bits per byte")
        ax.set_title("stdlib byte transformer (examples/stdlib_lm.toml)")
        ax.legend()
        fig.savefig(RESULTS / "workloads-lm.png", dpi=100)
    if "shapes" in results:
        sh = results["shapes"]
        fig, ax = plt.subplots(figsize=(7, 3.5), layout="constrained")
        for key, label in (("lenet5", "LeNet-5"), ("resnet18_w16", "ResNet-18 (width 16, BN)")):
            ax.plot(*zip(*sh[key]["curve"]), marker=".", label=label)
        ax.axhline(sh["linear_probe"]["test_accuracy"], color="#999", linestyle=":", label="linear probe")
        ax.set_xlabel("steps (one worker, batch 32, Adam 0.002)")
        ax.set_ylabel("test accuracy (5,000 images)")
        ax.set_title("shapes: the CIFAR-shaped stand-in")
        ax.legend()
        fig.savefig(RESULTS / "workloads-shapes.png", dpi=100)


def markdown(results: dict[str, Any]) -> str:
    lines = ["# Workloads, measured", ""]
    if "lm" in results:
        lm = results["lm"]
        lines += ["## stdlib byte transformer (examples/stdlib_lm.toml: 16 workers, BSP, sim)", "", _made_by(lm), "",
                  f"{lm['params']:,} parameters; target {lm['target']} bits per byte reached at "
                  f"{lm['time_to_target_s']:.1f} virtual s; the run stopped after {lm['iterations']:,} worker iterations "
                  f"({lm['stop_reason']}); wall {lm['wall_s']:.0f} s; final {lm['final_bits_per_byte']:.3f} bits per "
                  "byte.", "", "![curve](workloads-lm.png)", ""]
    if "shapes" in results:
        sh = results["shapes"]
        lines += ["## shapes (the BN image stand-in)", "", _made_by(sh), "",
                  f"{sh['train']:,} training and {sh['test']:,} test images.", "",
                  "| model | test accuracy | steps to 60% | steps to 80% | ms per step |", "|---|---:|---:|---:|---:|",
                  f"| linear probe (logistic regression on pixels) | {sh['linear_probe']['test_accuracy']:.3f} "
                  f"(train {sh['linear_probe']['train_accuracy']:.3f}) | - | - | - |"]
        for key, label in (("lenet5", "LeNet-5"), ("resnet18_w16", "ResNet-18, width 16, BN")):
            c = sh[key]
            lines.append(f"| {label} ({c['params']:,} parameters) | {c['curve'][-1][1]:.3f} after {STEPS} steps | "
                         f"{c['steps_to_60'] or 'not reached'} | {c['steps_to_80'] or 'not reached'} | "
                         f"{c['ms_per_step']} |")
        lines += ["", "![curves](workloads-shapes.png)", ""]
    return "\n".join(lines)


def _made_by(part: dict[str, Any]) -> str:
    made = part.get("provenance") or {}
    dirty = " (uncommitted changes)" if made.get("dirty_tree") else ""
    return f"`{made.get('command', '?')}` at {str(made.get('git_commit', '?'))[:10]}{dirty} on {made.get('cpu', '?')}"


PARTS = {"lm": measure_lm, "shapes": measure_shapes}


def file_provenance(results: dict[str, Any]) -> dict[str, Any]:
    """The file's own ``git_commit``, ``dirty_tree`` and ``command``, as every results file has them, derived
    from its parts (each measured by its own command, perhaps at its own commit): the common commit (None if
    the parts' differ: ``parts`` names each), dirty if any part was, the parts' commands in order; and
    ``written_by``, the invocation that wrote the file (a ``--render`` measures nothing)."""
    made = {part: results[part]["provenance"] for part in PARTS if part in results}
    commits = {m["git_commit"] for m in made.values()}
    return {"git_commit": commits.pop() if len(commits) == 1 else None,
            "dirty_tree": any(m["dirty_tree"] for m in made.values()),
            "command": " && ".join(m["command"] for m in made.values()),
            "parts": {part: m["git_commit"] for part, m in made.items()}, "written_by": provenance()}


def main(parts: list[str]) -> None:
    path = RESULTS / "workloads.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if parts != ["--render"]:
        for part in parts or list(PARTS):
            made_by = provenance()  # each part records the commit and command that measured it
            results[part] = {**PARTS[part](), "provenance": made_by}
        plot(results)
    results.pop("provenance", None)  # the last part's, which files before file_provenance kept at the top
    results.update(file_provenance(results))
    write_results("workloads", results, markdown(results))


if __name__ == "__main__":
    main(sys.argv[1:])
