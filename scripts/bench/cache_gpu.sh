#!/bin/sh
# The software cache's GPU checks and measurements in one call (issue #11), from the tree (or
# dist/) root with the paths set (`eval "$(make -s env)"`, or dist's own luajit on PATH):
#   1. #cuda parity: the GPU cache makes the CPU reference's decisions and keeps the rows device
#      tables keep; the pipeline against device tables; training losses of cached = device
#   2. compute-sanitizer memcheck and racecheck on the pipeline spec
#   3. the B4 measurement: dlrm_mlperf_v1_2m, all in HBM against cached 20% (with and without
#      the pipeline) and managed + hot_prefix 20%  (about 4 minutes)
#   sh scripts/bench/cache_gpu.sh [OUTDIR]
set -e
out=${1:-.}
mkdir -p "$out"
luajit spec/run.lua --tags=cuda spec/cache_cuda_spec.lua spec/pipeline_spec.lua spec/cache_train_spec.lua
compute-sanitizer --tool memcheck --error-exitcode 1 luajit spec/run.lua --tags=cuda spec/pipeline_spec.lua
compute-sanitizer --tool memcheck --error-exitcode 1 luajit spec/run.lua --tags=cuda spec/cache_cuda_spec.lua
compute-sanitizer --tool racecheck --error-exitcode 1 luajit spec/run.lua --tags=cuda spec/pipeline_spec.lua
luajit scripts/bench/cache.lua --gpu --steps 40 --out "$out/cache_gpu.jsonl"
