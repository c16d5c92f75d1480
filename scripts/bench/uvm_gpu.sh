#!/bin/sh
# UVM offload's GPU checks and measurements in one call (issue #10), from the tree (or dist/)
# root with the paths set (`eval "$(make -s env)"`, or dist's own luajit on PATH):
#   1. specs: access counters and permuted lookups of the CUDA kernels against the CPU, hint
#      policies' measured migration against their plans, managed training = device training
#      (with the CPU specs of the same files)
#   2. compute-sanitizer memcheck and racecheck on the #cuda specs of the counters, permutations
#      and policies (the CUPTI monitor's tests pend there: CUPTI takes one subscriber)
#   3. the measurement: scripts/bench/uvm.lua on dlrm_mlperf_v1_2m (device; managed with host,
#      hot_prefix and adaptive at 5/10/20/50/100% of the tables' bytes in HBM; none's first
#      200 steps), JSON lines to OUTDIR/uvm_gpu.jsonl, the table on stdout (about 5 minutes)
#   sh scripts/bench/uvm_gpu.sh [OUTDIR]
# Each step's exit status is printed at the end; the script fails if any step failed.
out=${1:-.}
mkdir -p "$out"
LUAJIT=${LUAJIT:-luajit}
SAN=${SAN:-compute-sanitizer}
CUDA_SPECS="spec/tbe_stats_spec.lua spec/hints_cuda_spec.lua"
. "$(dirname "$0")/steps.sh"
step specs env UVMREC_REQUIRE_GPU=1 "$LUAJIT" spec/run.lua $CUDA_SPECS spec/hints_spec.lua spec/hints \
  spec/tbe_cuda_spec.lua
step memcheck env UVMREC_REQUIRE_GPU=1 UVMREC_SANITIZER=1 "$SAN" --tool memcheck --error-exitcode 3 \
  "$LUAJIT" spec/run.lua --tags=cuda $CUDA_SPECS
step racecheck env UVMREC_REQUIRE_GPU=1 UVMREC_SANITIZER=1 "$SAN" --tool racecheck --error-exitcode 3 \
  "$LUAJIT" spec/run.lua --tags=cuda spec/tbe_stats_spec.lua
step bench "$LUAJIT" scripts/bench/uvm.lua --out "$out/uvm_gpu.jsonl"
steps_end
