#!/usr/bin/env bash
# Regenerate hypersack/_proto from proto/ (needs grpcio-tools, a dev dependency).
# The virtual include path makes the generated imports read `hypersack._proto.v1`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p hypersack/_proto/v1
python -m grpc_tools.protoc \
  -Ihypersack/_proto/v1=proto/hypersack/v1 \
  --python_out=. --grpc_python_out=. --pyi_out=. \
  proto/hypersack/v1/hypersack.proto
touch hypersack/_proto/__init__.py hypersack/_proto/v1/__init__.py
