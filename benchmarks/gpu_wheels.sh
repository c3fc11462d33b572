#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, fetched here (it reaches no registry): the packages shoal needs that its
# torch image does not hold, at the versions this checkout's .venv tested, for CPython 3.11-3.13 on x86-64 Linux.
# gpu_batched.sh installs them there (--no-index, --no-deps: pip takes the one wheel of each that fits), the ones
# wheels/requirements.txt pins.
#   bash benchmarks/gpu_wheels.sh     # writes wheels/ (git ignores it; about 24 MB, inside the 64 MiB a run carries)
# then: run(command="bash benchmarks/gpu_batched.sh", carry=["wheels"]).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/pip}"
# what the machine lacks: pydantic (with its own four, typing_extensions in case), simpy, jenkspy, highspy, mlxtend;
# and the test tools the run uses there (pytest with its own, pytest-timeout, hypothesis)
PACKAGES=(pydantic pydantic_core annotated-types typing-inspection typing_extensions simpy jenkspy highspy mlxtend
          pytest pluggy iniconfig pytest-timeout hypothesis sortedcontainers attrs)
pinned=()
for package in "${PACKAGES[@]}"; do
  version=$("$PIP" show "$package" 2>/dev/null | awk '/^Version:/ { print $2 }')
  [[ -n "$version" ]] || { echo "error: $package is not installed in the venv (make setup first)" >&2; exit 2; }
  pinned+=("$package==$version")
done
mkdir -p wheels
printf '%s\n' "${pinned[@]}" > wheels/requirements.txt  # what gpu_batched.sh installs
for python in 3.11 3.12 3.13; do
  "$PIP" download --quiet --no-deps --only-binary=:all: --python-version "$python" --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d wheels "${pinned[@]}" \
    2>&1 | grep -v "^WARNING: Location" || true
done
echo "wheels/: $(ls wheels/*.whl | wc -l) wheels, $(du -sh wheels | cut -f1) (${pinned[*]})"
