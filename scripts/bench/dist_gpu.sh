#!/bin/sh
# The run on several GPUs in one call (issue #30), from the tree (or dist/) root, with N GPUs
# (default: all of them; `uvmrec launch` forks the ranks where the host has no MPI and
# bootstraps NCCL through its rendezvous folder; NCCL_NVLS_ENABLE=0 stays set):
#   1. equality through NCCL: spec/support/dist_train.lua on the GPUs (GPU=1): `launch -n 1`
#      against the one-process run, then `launch -n 2` for each sharding kind with dlrm_tiny's
#      rowwise Adagrad (column-wise through the row sums' all-reduce) and a mixed plan (with
#      elementwise Adagrad); the tables after a step within 1e-4
#      (EXACT=0: cuBLAS may sum a row of a smaller batch otherwise), 40 steps' losses within 1e-5,
#      the AUC over the ranks within 1e-3
#   2. `uvmrec train` over 2 ranks (row-wise tables) against one process: spec/support/dist_runs.lua
#      compares the run directories (the same steps, losses within 1e-5, the final AUC within 1e-3);
#      and the same over 2 ranks with the tables `cached` and train.pipeline on (#20: the input
#      exchange and the cache fill of batch i+1 on the prefetch stream) against the one process
#   3. B9: scripts/bench/dist.lua, dlrm_mlperf_v1_2m at 65,536 samples a GPU: one GPU, then 2 (and
#      4 where there are 4) for table- and row-wise sharding; samples/s, the step time, and each
#      step's collectives (calls, bytes each way, host time); JSON lines to OUTDIR/dist_gpu.jsonl
#   sh scripts/bench/dist_gpu.sh [OUTDIR] [N]
# On a machine without GPUs it runs the same steps with ranks on the CPU (dlrm_tiny), which is
# how it was tried before a GPU run.  Each step's exit status is printed at the end; the script
# fails if any step failed.
out=${1:-build/bench}
UVMREC=${UVMREC:-build/bin/uvmrec}
[ -x "$UVMREC" ] || UVMREC=bin/uvmrec
mkdir -p "$out"
gpus=$("$UVMREC" -e 'io.write(require("uvmrec").devices())' 2>/dev/null || echo 0)
n=${2:-$gpus}
export NCCL_NVLS_ENABLE=0
. "$(dirname "$0")/steps.sh"
if [ "$gpus" -gt 0 ]; then
  dev="GPU=1"
  steps=40
else
  echo "dist_gpu: no GPU here; ranks on the CPU (dlrm_tiny)"
  dev="GPU=0"
  steps=5
  [ "$n" -gt 0 ] || n=2
fi
ada="embeddings.optimizer.name=adagrad"
step equal-1 env $dev PLAN=table_wise STEPS=$steps EXACT=0 "$UVMREC" launch -n 1 spec/support/dist_train.lua
for plan in table_wise row_wise column_wise data_parallel; do
  step "equal-2-$plan" env $dev PLAN=$plan STEPS=$steps EXACT=0 "$UVMREC" launch -n 2 spec/support/dist_train.lua
done
step "equal-2-mixed" env $dev PLAN=mixed STEPS=$steps EXACT=0 SETS=$ada "$UVMREC" launch -n 2 \
  spec/support/dist_train.lua
if [ "$gpus" -gt 0 ]; then cpu=""; else cpu="--cpu"; fi
targs="train dlrm_tiny $cpu --steps 40 --progress lines --set train.log_every=10 --set embeddings.sharding=row_wise"
rm -rf "$out/train-1" "$out/train-2"
# shellcheck disable=SC2086 # $targs is several words
step train-1 "$UVMREC" $targs --out "$out/train-1"
# shellcheck disable=SC2086
step train-2 "$UVMREC" launch -n 2 $targs --out "$out/train-2"
step train-compare "$UVMREC" spec/support/dist_runs.lua "$out/train-1" "$out/train-2"
rm -rf "$out/train-2-pipeline"
# shellcheck disable=SC2086
step train-2-pipeline "$UVMREC" launch -n 2 $targs --set embeddings.placement=cached --set train.pipeline=true \
  --out "$out/train-2-pipeline"
step train-compare-pipeline "$UVMREC" spec/support/dist_runs.lua "$out/train-1" "$out/train-2-pipeline"
if [ "$gpus" -gt 0 ]; then
  b9="--config dlrm_mlperf_v1_2m --per-rank 65536 --steps 20"
else
  b9="--cpu --per-rank 1024 --steps 5"
fi
# shellcheck disable=SC2086 # $b9 is several words
step b9-1 "$UVMREC" scripts/bench/dist.lua $b9 --out "$out/dist_gpu.jsonl"
for w in 2 4; do
  [ "$w" -le "$n" ] || continue
  for plan in table_wise row_wise; do
    # shellcheck disable=SC2086 # $b9 is several words
    step "b9-$w-$plan" "$UVMREC" launch -n $w scripts/bench/dist.lua $b9 --sharding $plan \
      --out "$out/dist_gpu.jsonl"
  done
done
steps_end
