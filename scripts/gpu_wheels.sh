#!/usr/bin/env bash
# The wheels a GPU machine without HyperSack's dependencies needs, into .whl/ (which
# scripts/gpu_checks.sh installs beside that machine's Python, in /tmp/hs-site). For a
# machine that has torch, numpy and numba but not the rest, and no internet:
#
#   bash scripts/gpu_wheels.sh 3.12      # the GPU machine's Python version
#
# Downloaded for manylinux x86_64 from this machine's package index. What such images
# usually have already (numpy, pandas, PyYAML, ...) is dropped to keep the copy small.
set -eu
cd "$(dirname "$0")/.."
PYVER=${1:?"the GPU machine's Python version, e.g. 3.12"}
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d .whl \
    "pydantic>=2.6,<3" "pydantic-settings>=2.3,<3" "ortools>=9.10,<10" \
    "protobuf>=6.33.1,<6.34" "grpcio>=1.78,<1.82" "grpcio-health-checking>=1.78,<1.82" \
    "grpcio-reflection>=1.78,<1.82" "cryptography>=42" "optuna>=4.2,<6"
rm -f .whl/numpy-* .whl/pandas-* .whl/python_dateutil-* .whl/tzdata-* .whl/pyyaml-* \
    .whl/tqdm-* .whl/typing_extensions-* .whl/absl_py-* .whl/packaging-*
du -sh .whl
