#!/bin/sh
# The software cache's GPU checks and measurements in one call (issue #11), from the tree (or
# dist/) root with the paths set (`eval "$(make -s env)"`, or dist's own luajit on PATH):
#   1. #cuda specs: the GPU cache makes the CPU reference's decisions batch by batch and keeps
#      the rows device tables keep; the prefetch pipeline against device tables (through the
#      hard case); the training losses of cached tables (with and without the pipeline) equal
#      device tables'; page prefetch of managed tables; then the decisions at the B4 shape
#      (scripts/bench/cache_decide.lua: id for id against the CPU, and their time)
#   2. compute-sanitizer memcheck and racecheck on the cache and pipeline specs
#   3. the B4 measurement: dlrm_mlperf_v1_2m at batch 65536, all in HBM against cached 20%
#      (with and without the pipeline) and managed + hot_prefix at 20%: samples/s, ratio, bytes
#      over the host link per step; JSON lines to OUTDIR/cache_gpu.jsonl (a few minutes)
#   sh scripts/bench/cache_gpu.sh [OUTDIR]
# Each step's exit status is printed at the end; the script fails if any step failed.
out=${1:-.}
mkdir -p "$out"
LUAJIT=${LUAJIT:-luajit}
SAN=${SAN:-compute-sanitizer}
. "$(dirname "$0")/steps.sh"
step specs "$LUAJIT" spec/run.lua --tags=cuda spec/cache_cuda_spec.lua spec/pipeline/prefetch_spec.lua \
  spec/cache_spec.lua spec/tbe_spec.lua
step decide "$LUAJIT" scripts/bench/cache_decide.lua --out "$out/cache_decide.jsonl"
step memcheck-pipeline "$SAN" --tool memcheck --error-exitcode 1 "$LUAJIT" spec/run.lua --tags=cuda \
  spec/pipeline/prefetch_spec.lua
step racecheck-pipeline "$SAN" --tool racecheck --error-exitcode 1 "$LUAJIT" spec/run.lua --tags=cuda \
  spec/pipeline/prefetch_spec.lua
step memcheck-cache "$SAN" --tool memcheck --error-exitcode 1 "$LUAJIT" spec/run.lua --tags=cuda \
  spec/cache_cuda_spec.lua
step racecheck-cache "$SAN" --tool racecheck --error-exitcode 1 "$LUAJIT" spec/run.lua --tags=cuda \
  spec/cache_cuda_spec.lua
step bench "$LUAJIT" scripts/bench/cache.lua --gpu --steps 40 --out "$out/cache_gpu.jsonl"
steps_end
