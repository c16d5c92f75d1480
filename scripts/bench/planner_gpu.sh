#!/bin/sh
# The planner's GPU checks and B10's GPU row in one call (issue #21, for the GPU run #28), from
# the tree (or dist/) root with the paths set (`eval "$(make -s env)"`, or dist's own luajit on
# PATH):
#   1. #cuda specs: a plan trained under its HBM budget peaks at most 5% over its prediction
#      (spec/planner/train_plan_spec.lua), and the budget refuses what passes it
#   2. `uvmrec calibrate` on this GPU, at the GPU's shapes (MLPerf's MLP stacks at batches 16384
#      and 65536, the interaction at 27 x 128, 65536 ids a table; about a minute):
#      OUTDIR/calib_gpu.json and its log OUTDIR/calib_gpu.log (compare with the shipped
#      lua/uvmrec/planner/calib/h200.json; copy it there to refresh the default).  A rate that
#      comes out absurd fails the step, naming the rate and its measurements; b10-fresh is then
#      skipped
#   3. B10 / B4 with a plan: dlrm_mlperf_v1_2m at batch 65536 (bf16 MLPs), every table device,
#      cached at 0.2, managed with a 20% hot prefix, and the planner's plan in the HBM the cached
#      case needs: predicted against measured ms a step, samples/s, the HBM peak against the
#      prediction; once with the fresh calibration, once with the shipped one; JSON lines to
#      OUTDIR/b10_gpu.jsonl
#   sh scripts/bench/planner_gpu.sh [OUTDIR]
# Each step's exit status and seconds are printed at the end; the script fails if any step failed.
out=${1:-.}
mkdir -p "$out"
LUAJIT=${LUAJIT:-luajit}
if [ -z "$UVMREC" ]; then
  if [ -x bin/uvmrec ]; then UVMREC=bin/uvmrec; else UVMREC=build/bin/uvmrec; fi
fi
summary=""
fail=0
step() {
  name=$1
  shift
  echo "== $name: $*"
  t0=$(date +%s)
  "$@"
  rc=$?
  summary="$summary
$name: rc=$rc ($(( $(date +%s) - t0 )) s)"
  [ $rc -eq 0 ] || fail=1
}
step specs "$LUAJIT" spec/run.lua --tags=cuda spec/planner/train_plan_spec.lua
rm -f "$out/calib_gpu.json"
step calibrate sh -c '"$1" calibrate --shapes gpu --out "$2" >"$3" 2>&1; rc=$?; cat "$3"; exit $rc' calibrate \
  "$UVMREC" "$out/calib_gpu.json" "$out/calib_gpu.log"
if [ -f "$out/calib_gpu.json" ]; then
  step b10-fresh "$UVMREC" scripts/bench/planner_b10.lua dlrm_mlperf_v1_2m --calibration "$out/calib_gpu.json" \
    --cases device,cached,managed,planned --steps 40 --warmup 10 --out "$out/b10_gpu.jsonl"
fi
step b10-shipped "$UVMREC" scripts/bench/planner_b10.lua dlrm_mlperf_v1_2m --calibration h200 \
  --cases device,cached,managed,planned --steps 40 --warmup 10 --out "$out/b10_gpu.jsonl"
echo "== summary$summary"
exit $fail
