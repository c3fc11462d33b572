#!/usr/bin/env bash
# The batched simulator on a lent GPU machine (issue 41), as one prepared run: torch 2.11 there, no registry.
#   1. install the wheels carried in wheels/ (pydantic, simpy, jenkspy, highspy, mlxtend: benchmarks/gpu_wheels.sh
#      fetches them here first) without dependencies, and shoal itself from the working tree;
#   2. the batched simulator's tests on that torch version (equivalence on the CPU, schemes, fallback);
#   3. seconds per simulated round, loop against batched, on CUDA (backend.device auto), results into $OUT;
#   4. the same for balanced BSP (unequal batches padded into one call), 64 workers.
# Usage on the device: bash benchmarks/gpu_batched.sh   (needs $OUT; about 8 minutes), carrying wheels/
set -euo pipefail
# wheels/ (benchmarks/gpu_wheels.sh) holds each package of wheels/requirements.txt for several Pythons: pip takes
# the one that fits; all in one call, else one at a time (one that does not fit must not keep the others out)
mapfile -t WHEELS < wheels/requirements.txt
install() {  # pip's own exit status; its output without the lines about index folders this machine lacks
  local rc=0
  python -m pip install -q --no-deps --no-index --find-links wheels "$@" > "${TMPDIR:-/tmp}/pip.log" 2>&1 || rc=$?
  grep -v "^WARNING: Location" "${TMPDIR:-/tmp}/pip.log" | tail -3 || true
  return "$rc"
}
install "${WHEELS[@]}" || for wheel in "${WHEELS[@]}"; do install "$wheel" || echo "not installed: $wheel"; done
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2 || true
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_batched.py 2>&1 | tail -5 || true
PYTHONPATH=src timeout 330 python benchmarks/sim_speed.py --batched --workers 16,64 --rounds 3 --repeats 1
cp benchmarks/results/sim_speed_batched-cuda.* "${OUT:-/tmp}/" 2>/dev/null || true
# balanced BSP: every worker's batch its own size, padded into shared calls (a round in one call per 64)
PYTHONPATH=src timeout 90 python benchmarks/sim_speed.py --batched --workers 64 --rounds 2 --repeats 1 \
  --schemes bsp+balance --tag balance || true
cp benchmarks/results/sim_speed_batched-cuda-balance.* "${OUT:-/tmp}/" 2>/dev/null || true
