"""The batch-norm ResNet-18 with NCHW against NHWC activations (``model.options.channels_last``), on one CPU core.

A study run of the image workload spends its wall time in the ResNet's
gradients and evaluations. NHWC (channels-last) activations let the CPU's
convolution kernels run faster on the same network; this measures by how
much, through the engine the simulator uses: one worker's gradient (batch
32) and an evaluation of held-out images, both layouts interleaved in every
repetition so that machine load affects them alike, from the same
parameters, and checks that they compute the same numbers (to float32
rounding: the additions come in another order).

Usage:
    .venv/bin/python benchmarks/conv_layout.py [--repeats 5] [--examples 1000]

Results: benchmarks/results/conv_layout.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from tuned import ROOT, provenance, write_results

CONFIG = "examples/shapes_bn.toml"
LAYOUTS = {"NCHW (default)": "{width = 16}", "NHWC (channels_last = true)": "{width = 16, channels_last = true}"}


def engines() -> dict[str, Any]:
    """Each layout's engine and the data, from the image workload's example config."""
    from shoal.config import load_config
    from shoal.engine.setup import build_setup

    return {name: build_setup(load_config(str(ROOT / CONFIG), [f"model.options={options}"]))
            for name, options in LAYOUTS.items()}


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def measure(repeats: int, examples: int) -> dict[str, Any]:
    setups = engines()
    first = next(iter(setups.values()))
    params, buffers = first.engine.initial_state()
    x, y = first.dataset.x_train[:32], first.dataset.y_train[:32]
    xt, yt = first.dataset.x_test[:examples], first.dataset.y_test[:examples]
    seconds: dict[str, dict[str, list[float]]] = {n: {"gradient": [], "evaluation": []} for n in setups}
    grads, values = {}, {}
    for setup in setups.values():  # warm-up
        setup.engine.gradient(params, buffers, x, y)
    for _ in range(repeats):
        for name, setup in setups.items():
            for _ in range(4):
                s, (grads[name], _, _) = timed(lambda: setup.engine.gradient(params, buffers, x, y))
                seconds[name]["gradient"].append(s)
            s, evaluation = timed(lambda: setup.engine.evaluate(params, buffers, xt, yt))
            seconds[name]["evaluation"].append(s)
            values[name] = evaluation.value
    base, other = list(setups)
    median = {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in seconds.items()}
    return {
        "examples": examples, "median_s": {n: {k: round(v, 4) for k, v in m.items()} for n, m in median.items()},
        "speedup": {k: round(median[base][k] / median[other][k], 2) for k in ("gradient", "evaluation")},
        "max_gradient_difference": float((grads[base] - grads[other]).abs().max()),
        "gradient_scale": float(grads[base].abs().max()),
        "relative_gradient_difference": float((grads[base] - grads[other]).norm() / grads[base].norm()),
        "relative_gradient_difference_float64": float64_difference(),
        "metric": {n: values[n] for n in setups},
    }


def float64_difference() -> float:
    """The relative L2 difference of one gradient in the two layouts in float64: rounding alone (about 1e-15)
    shows that the float32 difference is an order of additions, not another computation."""
    from shoal.models import build_model

    grads = []
    for options in ({"width": 16}, {"width": 16, "channels_last": True}):
        torch.manual_seed(0)
        model = build_model("resnet18", (3, 32, 32), 10, options=options).double()
        x, y = torch.randn(32, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (32,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return float((grads[0] - grads[1]).norm() / grads[0].norm())


def markdown(record: dict[str, Any]) -> str:
    r = record["result"]
    base, other = list(LAYOUTS)
    lines = ["# The batch-norm ResNet-18 in NCHW and NHWC layouts (one CPU core)", "",
             f"`{record['command']}` at {record['git_commit'][:10]} on {record['cpu']}, torch {record['torch']}: "
             f"median seconds over {record['repeats']} repetitions, the layouts interleaved in each; "
             f"{CONFIG} (width 16, 32x32 images).", "",
             "| layout | gradient (batch 32) | evaluation | metric |", "|---|---:|---:|---:|"]
    for name in LAYOUTS:
        m = r["median_s"][name]
        lines.append(f"| {name} | {m['gradient'] * 1000:.1f} ms | {m['evaluation']:.2f} s ({r['examples']} "
                     f"images) | {r['metric'][name]:.4f} |")
    lines += ["", f"NHWC against NCHW: gradient {r['speedup']['gradient']:.2f}x, evaluation "
                  f"{r['speedup']['evaluation']:.2f}x faster. One gradient differs by "
                  f"{r['relative_gradient_difference']:.1e} (relative L2; its largest entry by "
                  f"{r['max_gradient_difference']:.1e}, the largest entry is {r['gradient_scale']:.1e}) in float32 "
                  f"and by {r['relative_gradient_difference_float64']:.0e} in float64: the same network, its float "
                  "additions in another order. The studies started after the option existed use it; "
                  "`lowcomm.py shapes-1g`, started before, keeps the default."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--examples", type=int, default=1000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = {**provenance(), "repeats": args.repeats, "result": measure(args.repeats, args.examples)}
    write_results("conv_layout", record, markdown(record))


if __name__ == "__main__":
    main(sys.argv[1:])
