#!/bin/sh
# The full-scale GPU run of issue #29 in one call, from a `make dist` tree's root (it builds
# nothing; the machine starts empty, so the day files are made here):
#   1. datagen: `uvmrec datagen mlperf_v1` of SAMPLES samples into OUT/days (MB/s; >= 500 asked)
#   2. B8: the loader's samples/s from those day files, shuffled, batch 65,536, on 1..16 threads
#   3. build: tables drawn per GiB (pinned, streamed from the GPU; managed, on the host cores)
#   4. B5: dlrm_mlperf_v1, every table cached in 16 GiB of HBM (the HBM budget: what the model
#      needs besides its tables, plus 16 GiB; pinned host backing, no managed memory), fed from
#      the day files through the prefetch pipeline, STEPS timed steps; its first losses checked
#      against the same model with its tables in HBM; hit rate, host-link bytes a step, peak
#      host memory, the projected Criteo 1TB epoch
#   5. dcnv2 (only when ONLY names it): dlrm_dcnv2 (the same 187.8 M rows x 128, 89.5 GiB, multi-hot:
#      214 ids a sample; rowwise Adagrad; batch 65,536) fed by the GPU generator from its own
#      synthetic:dcnv2 (no day files), DCN_WARM + DCN_STEPS steps a run: all in HBM (the
#      reference: samples/s, its first CHECK losses, what the model needs in HBM besides its
#      tables), then every table cached in each of DCN_HBM (16GiB,32GiB); each cached run's first
#      CHECK losses must equal the reference's bit for bit; hit rate, host-link bytes a step, HBM
#      peak (MLPerf's DCNv2: about 2.1 M samples/s an H200)
#   6. one table of all of it (scripts/bench/scale.lua --table)
#   sh scripts/bench/scale_gpu.sh [OUT]  (env: SAMPLES, STEPS, HBM, HOST_MEMORY, UVMREC, ONLY, GIB, CHECK,
#                                         DCN_STEPS, DCN_WARM, DCN_HBM)
# Expected on one H200 with its 16-core host: datagen ~25 s (10.5 GB), B8 ~1.5 min (checks
# included), build ~1 min, B5 ~4 min (three builds of 89.5 GiB: all-in-HBM and cached for the
# check, cached for the timed run; 2050 steps; CHECK=0 skips the two check builds): about 7-8
# minutes.  dcnv2 ~4.5 min (three builds: all in HBM ~15 s, cached twice ~65 s each as B5's;
# 3 x 520 steps at an estimated 50 ms in HBM, 100 ms cached: ~2.2 min), run alone:
# ONLY=dcnv2.  ONLY="datagen b8" runs
# those steps alone (datagen is needed by b8 and b5 in the same call).  Each step's exit status
# is printed at the end; the script fails if any step failed.
out=${1:-scale-out}
UVMREC=${UVMREC:-bin/uvmrec}
SAMPLES=${SAMPLES:-65536000}      # 1000 batches: 10.5 GB of day files (a B5 step reads 1 batch)
STEPS=${STEPS:-2000}
HBM=${HBM:-16GiB}
HOST_MEMORY=${HOST_MEMORY:-120GiB}
ONLY=${ONLY:-datagen b8 build b5}
mkdir -p "$out"
. "$(dirname "$0")/steps.sh"
nproc_=$(nproc)
threads="1,2,4,8"
[ "$nproc_" -ge 16 ] && threads="1,2,4,8,16"
echo "== host: $nproc_ cores; $(free -g | awk '/Mem:/ {print $2 " GiB memory"}'); load $(cut -d' ' -f1 /proc/loadavg)"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null
step datagen "$UVMREC" datagen mlperf_v1 --out "$out/days" --samples "$SAMPLES" --report "$out/scale.jsonl"
step b8 "$UVMREC" scripts/bench/loader.lua --dir "$out/days" --threads "$threads" --batches 100 \
  --out "$out/scale.jsonl"
gpu_flag=""
nvidia-smi -L >/dev/null 2>&1 && gpu_flag=--gpu
step build "$UVMREC" scripts/bench/build.lua --gib "${GIB:-8}" --threads "$nproc_" $gpu_flag --out "$out/scale.jsonl"
step b5 "$UVMREC" scripts/bench/scale.lua --dir "$out/days" --steps "$STEPS" --hbm "$HBM" \
  --host-memory "$HOST_MEMORY" --check "${CHECK:-4}" --out "$out/scale.jsonl"
step dcnv2 "$UVMREC" scripts/bench/scale.lua --config dlrm_dcnv2 --steps "${DCN_STEPS:-500}" \
  --warm "${DCN_WARM:-20}" --hbm "${DCN_HBM:-16GiB,32GiB}" --host-memory "$HOST_MEMORY" --check "${CHECK:-4}" \
  --out "$out/scale.jsonl"
echo "== table"
"$UVMREC" scripts/bench/scale.lua --table "$out/scale.jsonl"
steps_end
