#!/usr/bin/env bash
# uvmrec against PyTorch on one GPU, in one call (issue 9): step parity, training parity, speed.
#
#   bash scripts/bench/torch_compare.sh            # from the repository root
#   UVMREC=dist/bin/uvmrec PYTHON=python3 OUT=dir WORK=/tmp/torch_compare bash scripts/bench/torch_compare.sh
#   (TORCH_DEVICE=cpu, PARITY_DOT, PARITY_DCN, PARITY_CASES, PARITY_VARIANTS, TRAIN_ARGS and SPEED_ARGS
#   override the GPU defaults, for a smoke test elsewhere; SKIP="parity train speed" leaves parts out;
#   TORCH_DLRM_EXPERT_CONFIGS picks the expert variant's configurations, see torch_dlrm.py)
#
# Two PyTorch variants (scripts/bench/torch_dlrm.py): plain (one nn.EmbeddingBag a table, sparse
# gradients coalesced, eager) and expert (one concatenated table, uncoalesced atomic SGD,
# torch.compile, bf16 autocast, the step as one CUDA graph); B3's ratio is against the faster.
# 1. Parity of one step (scripts/bench/parity.lua, then torch_dlrm.py parity on the GPU, each
#    variant): the MLPerf v1 DLRM shape (dim 128, MLPs 512-256-128 and 1024-1024-512-256-1, dot)
#    in f32, TF32 and bf16, and DLRM-DCNv2 (3 cross layers of rank 512 over 3456 columns,
#    multi-hot bags) in f32 and bf16, tables capped at 20,000 rows so the checkpoints stay small.
# 2. Training parity (train_parity.lua): dlrm_kaggle at the Kaggle table sizes (33.8 M rows),
#    batch 128, SGD 0.1, on 1.4 M synthetic samples in 7 day files (6 trained on, 1 held out).
# 3. Speed (dlrm_speed.lua): dlrm_mlperf_v1_2m at batch 65536, f32, TF32 and bf16, uvmrec and both
#    PyTorch variants (the expert's step checked against the plain one's first), uvmrec's phases
#    against their floor.
# Big files go to WORK; logs and JSON lines to OUT (the plot is drawn elsewhere from
# OUT/train_parity/*.jsonl with scripts/bench/train_parity_plot.py).  Exits non-zero when a check
# fails; the summary table is printed last.
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
UVMREC=${UVMREC:-dist/bin/uvmrec}
# build/venv's Python (make pydeps-torch: the pinned PyTorch) where there is one.
if [ -x build/venv/bin/python ]; then PYTHON=${PYTHON:-build/venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
OUT=${OUT:-build/torch_compare}
WORK=${WORK:-/tmp/torch_compare}
TORCH_DEVICE=${TORCH_DEVICE:-cuda}
TRAIN_ARGS=${TRAIN_ARGS:---config dlrm_kaggle --samples 1400000 --set train.log_every=50}
SPEED_ARGS=${SPEED_ARGS:---config dlrm_mlperf_v1_2m --precisions f32,tf32,bf16 --steps 30}
PARITY_CASES=${PARITY_CASES:-dot:f32:mlperf dot:tf32:mlperf dot:bf16:mlperf dcnv2:f32:dcnv2 dcnv2:bf16:dcnv2}
PARITY_VARIANTS=${PARITY_VARIANTS:-plain expert}
SKIP=${SKIP:-}
skip() { case " $SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$OUT" "$WORK" "$OUT/train_parity"
fail=0
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

"$UVMREC" --version || exit 2
"$PYTHON" -c 'import torch, numpy; print("torch", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())' || exit 2

# ---- 1. parity of one step ----
rm -f "$OUT/parity.jsonl"
if ! skip parity; then
  stamp "data for the parity cases"
  "$UVMREC" scripts/datagen.lua mlperf_v1 --out "$WORK/mlperf" --samples 8192 | tail -1
  "$UVMREC" scripts/datagen.lua dcnv2 --out "$WORK/dcnv2" --samples 4096 | tail -1
  DOT=${PARITY_DOT:---config dlrm_mlperf_v1 --set embeddings.max_rows=20000 --batch 8192}
  DCN=${PARITY_DCN:---config dlrm_dcnv2 --set embeddings.max_rows=20000 --batch 4096}
  for c in $PARITY_CASES; do
    # shellcheck disable=SC2086
    set -- ${c//:/ }
    stamp "parity $1 $2"
    args=$DOT; [ "$1" = dcnv2 ] && args=$DCN
    # shellcheck disable=SC2086
    if ! "$UVMREC" scripts/bench/parity.lua $args --precision "$2" --data "$WORK/$3" \
        --ckpt "$WORK/w_$1_$2.safetensors" --dump "$WORK/g_$1_$2.safetensors"; then
      echo "parity $1 $2: uvmrec failed"; fail=1; continue
    fi
    for v in $PARITY_VARIANTS; do
      "$PYTHON" scripts/bench/torch_dlrm.py parity --variant "$v" --ckpt "$WORK/w_$1_$2.safetensors" \
        --dump "$WORK/g_$1_$2.safetensors" --data "$WORK/$3" --device "$TORCH_DEVICE" --out "$OUT/parity.jsonl" \
        || fail=1
    done
  done
fi

# ---- 2. training parity ----
if ! skip train; then
  stamp "training parity"
  # shellcheck disable=SC2086
  "$UVMREC" scripts/bench/train_parity.lua $TRAIN_ARGS --work "$WORK/train" --python "$PYTHON" \
    --torch-device "$TORCH_DEVICE" || fail=1
  cp "$WORK/train/uvmrec/metrics.jsonl" "$OUT/train_parity/uvmrec.jsonl" 2>/dev/null
  cp "$WORK/train/torch.jsonl" "$WORK/train/summary.jsonl" "$OUT/train_parity/" 2>/dev/null
fi

# ---- 3. speed ----
rm -f "$OUT/speed.jsonl" "$OUT/torch_speed.jsonl"
if ! skip speed; then
  stamp "speed"
  # shellcheck disable=SC2086
  "$UVMREC" scripts/bench/dlrm_speed.lua $SPEED_ARGS --work "$WORK/speed" --python "$PYTHON" --out "$OUT/speed.jsonl" \
    | tee "$OUT/speed.txt" || fail=1
  cp "$WORK/speed/torch_speed.jsonl" "$OUT/" 2>/dev/null
  # Both PyTorch variants must have run in every precision, the expert after its check.
  "$PYTHON" -c '
import json, sys
try:
    rs = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    rs = []
ran = {(r["precision"], r["variant"]) for r in rs if r["bench"] == "torch_dlrm_variant" and not r.get("failed")}
precisions = sorted({r["precision"] for r in rs if "precision" in r})
missing = [f"{v} in {p}" for p in precisions for v in ("plain", "expert") if (p, v) not in ran]
if missing or not rs:
    print("speed: PyTorch did not run: " + (", ".join(missing) or "no result"))
sys.exit(1 if missing or not rs else 0)
' "$OUT/torch_speed.jsonl" || fail=1
fi

# ---- the summary ----
stamp "summary"
"$PYTHON" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def lines(p):
    try:
        return [json.loads(l) for l in open(os.path.join(out, p))]
    except OSError:
        return []
cases = {}
for r in lines("parity.jsonl"):
    k = (r["interaction"], r["precision"], r.get("variant", "plain"))
    c = cases.setdefault(k, {"n": 0, "bad": 0, "f64": 0, "worst": -1.0, "what": ""})
    c["n"] += 1
    c["bad"] += not r["ok"]
    c["f64"] += r["by"] == "f64"
    if r["kind"] != "batch" and r["rel"] / r["tol"] > c["worst"]:
        c["worst"] = r["rel"] / r["tol"]
        c["what"] = f'{r["quantity"]} {r["rel"]:.2g} (tol {r["tol"]:.2g}; to f64: uvmrec {r["e_uvmrec"]:.2g}, torch {r["e_torch"]:.2g})'
print("\nstep parity, uvmrec against PyTorch (each variant):")
for (i, p, v), c in sorted(cases.items()):
    print(f"  {i:6} {p:5} {v:6} {c['n'] - c['bad']}/{c['n']} ok ({c['f64']} by the float64 arbiter); "
          f"furthest: {c['what']}")
for r in lines("train_parity/summary.jsonl"):
    print(f"training parity: {r['model']}, {r['steps']} steps of {r['batch']}: AUC uvmrec {r['uvmrec_auc']:.4f}, "
          f"PyTorch {r['torch_auc']:.4f}, |diff| {r['auc_diff']:.4f} (allowed {r['tol']}): {'ok' if r['ok'] else 'FAIL'}")
variants = {}
for r in lines("torch_speed.jsonl"):
    if r["bench"] == "torch_dlrm_variant":
        k = (r["precision"], r["variant"])
        if r.get("failed"):
            variants.setdefault(k, None)
        elif variants.get(k) is None or r["ms"] < variants[k]["ms"]:
            variants[k] = r
def rate(r):
    return f"{r['samples_per_s'] / 1e6:.3f}" if r else "failed"
print(f"\n{'math':6} {'uvmrec M/s':>11} {'plain M/s':>10} {'expert M/s':>11} {'uvmrec/faster':>14} {'floor ms':>9} "
      f"{'step ms':>8} {'gaps ms':>8}  expert configuration")
for r in lines("speed.jsonl"):
    p = r["precision"]
    ex = variants.get((p, "expert"))
    print(f"{p:6} {r['samples_per_s'] / 1e6:11.3f} {rate(variants.get((p, 'plain'))):>10} {rate(ex):>11} "
          f"{r.get('ratio') or float('nan'):14.2f} {r.get('floor_ms') or float('nan'):9.3f} {r['ms']:8.3f} "
          f"{r['gaps_ms']:8.3f}  {ex['config'] if ex else '-'}")
EOF
stamp "done (exit $fail)"
exit $fail
