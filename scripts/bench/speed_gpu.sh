#!/bin/sh
# shellcheck disable=SC2317 # (functions run through step)
# The training step's kernels on one GPU (issue 24), from a dist/ tree (`make dist`: nothing is
# built on the GPU machine) or a built checkout, in calls of about 10 minutes each:
#   sh scripts/bench/speed_gpu.sh check [OUTDIR]  correctness: the #cuda specs of the new kernels
#       (interaction on tensor cores, the MLP chain with its epilogues and side stream, the
#       tables' backward with its chunked long rows and atomic SGD, CUDA graphs of the step),
#       compute-sanitizer memcheck and racecheck on them, then the step parity against both
#       PyTorch variants (torch_compare.sh parity: dot f32 / TF32 / bf16, DCNv2 f32 / bf16)
#   sh scripts/bench/speed_gpu.sh b3 [OUTDIR]     B3: dlrm_mlperf_v1_2m at batch 65536, TF32 and
#       bf16, uvmrec's step and its phases against their floors beside both PyTorch variants in
#       the same run (torch_compare.sh speed)
#   sh scripts/bench/speed_gpu.sh more [OUTDIR]   uvmrec's bf16 step replayed as CUDA graphs and
#       with the atomic SGD step (embeddings.optimizer.deterministic=false); B2 (tbe.lua: f32
#       tables in HBM, forward + SGD sorted and atomic, rowwise Adagrad)
#   sh scripts/bench/speed_gpu.sh all [OUTDIR]    the three (about 30 minutes)
# Every call ends with one table of everything OUTDIR holds so far (summary: just the table).
# Env: UVMREC (bin/uvmrec of this tree), PYTHON (a Python with torch), SAN (compute-sanitizer),
# WORK (big files; /tmp/speed_gpu).  Exits non-zero when a step failed; the table lists each.
set -u
cd "$(dirname "$0")/../.." || exit 2
stage=${1:-all}
out=${2:-build/speed_gpu}
if [ -z "${UVMREC:-}" ]; then
  if [ -x bin/uvmrec ]; then UVMREC=bin/uvmrec; else UVMREC=build/bin/uvmrec; fi
fi
if [ -x build/venv/bin/python ]; then PYTHON=${PYTHON:-build/venv/bin/python}; else PYTHON=${PYTHON:-python3}; fi
SAN=${SAN:-compute-sanitizer}
WORK=${WORK:-/tmp/speed_gpu}
mkdir -p "$out" "$WORK"
out=$(cd "$out" && pwd)
fail=0
t0=$(date +%s)

# step NAME CMD...: runs it, appends "NAME rc seconds" to OUTDIR/steps.txt
step() {
  name=$1
  shift
  echo "== $name ($(( $(date +%s) - t0 )) s): $*"
  s0=$(date +%s)
  "$@"
  rc=$?
  echo "$name $rc $(( $(date +%s) - s0 ))" >> "$out/steps.txt"
  [ $rc -eq 0 ] || fail=1
}

gpu_specs() {
  UVMREC_REQUIRE_GPU=1 "$UVMREC" spec/run.lua --tags=cuda "$@"
}

sanitize() {
  tool=$1
  shift
  UVMREC_REQUIRE_GPU=1 "$SAN" --tool "$tool" --error-exitcode 1 "$UVMREC" spec/run.lua --tags=cuda "$@"
}

check() {
  step specs gpu_specs spec/dense_cuda_spec.lua spec/tbe_cuda_spec.lua spec/train/graph_spec.lua \
    spec/nn/module_cuda_spec.lua
  step memcheck-interaction sanitize memcheck --filter="tensor cores" spec/dense_cuda_spec.lua
  step racecheck-interaction sanitize racecheck --filter="tensor cores" spec/dense_cuda_spec.lua
  step memcheck-mlp sanitize memcheck --filter="fused chain" spec/dense_cuda_spec.lua
  step racecheck-mlp sanitize racecheck --filter="fused chain" spec/dense_cuda_spec.lua
  step memcheck-tbe sanitize memcheck --filter="payloads" --filter="atomics" --filter="chunks" \
    spec/tbe_cuda_spec.lua
  step racecheck-tbe sanitize racecheck --filter="payloads" --filter="chunks" spec/tbe_cuda_spec.lua
  step memcheck-graph sanitize memcheck spec/train/graph_spec.lua
  step parity env OUT="$out/compare" WORK="$WORK/compare" UVMREC="$UVMREC" PYTHON="$PYTHON" SKIP="train speed" \
    bash scripts/bench/torch_compare.sh
}

b3() {
  step b3 env OUT="$out/compare" WORK="$WORK/compare" UVMREC="$UVMREC" PYTHON="$PYTHON" SKIP="parity train" \
    SPEED_ARGS="--config dlrm_mlperf_v1_2m --precisions tf32,bf16 --steps 30" bash scripts/bench/torch_compare.sh
}

more() {
  data=""
  [ -d "$WORK/compare/speed/days" ] && data="--data $WORK/compare/speed/days"
  rm -f "$out/more.jsonl"
  # a graph cannot hold bounds 'fatal' (it reads the GPU's flags every forward): 'warn' counts
  # shellcheck disable=SC2086
  step b3-graph "$UVMREC" scripts/bench/dlrm_speed.lua --precisions bf16 --no-torch --graph $data \
    --set embeddings.bounds=warn \
    --work "$WORK/more" --out "$out/more.jsonl"
  # shellcheck disable=SC2086
  step b3-atomic "$UVMREC" scripts/bench/dlrm_speed.lua --precisions bf16 --no-torch $data \
    --set embeddings.optimizer.deterministic=false --work "$WORK/more" --out "$out/more.jsonl"
  step b2 "$UVMREC" scripts/bench/tbe.lua --gpu --only "device f32" --out "$out/b2.jsonl"
}

"$UVMREC" --version || exit 2
case $stage in
  check) check ;;
  b3) b3 ;;
  more) more ;;
  all) check; b3; more ;;
  summary) ;;
  *) echo "speed_gpu.sh: stage '$stage' is not check, b3, more, all or summary" >&2; exit 2 ;;
esac

# ---- one table of everything OUTDIR holds ----
"$PYTHON" - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def lines(p):
    try:
        return [json.loads(l) for l in open(os.path.join(out, p)) if l.strip()]
    except OSError:
        return []
COPY = 4250e9
print("\n==== speed_gpu summary (%s) ====" % out)
steps = []
try:
    steps = [l.split() for l in open(os.path.join(out, "steps.txt"))]
except OSError:
    pass
last = {}
for s in steps:
    last[s[0]] = s
print("\nsteps (the last run of each):")
for name, s in last.items():
    print(f"  {name:24} {'ok' if s[1] == '0' else 'FAILED rc=' + s[1]:12} {s[2]:>5} s")
cases = {}
for r in lines("compare/parity.jsonl"):
    k = (r["interaction"], r["precision"], r.get("variant", "plain"))
    c = cases.setdefault(k, [0, 0])
    c[0] += 1
    c[1] += not r["ok"]
if cases:
    print("\nstep parity against PyTorch (quantities within tolerance):")
    for (i, p, v), (n, bad) in sorted(cases.items()):
        print(f"  {i:6} {p:5} {v:7} {n - bad}/{n}{'' if not bad else '  FAILED'}")
variants = {}
for r in lines("compare/torch_speed.jsonl"):
    if r.get("bench") == "torch_dlrm_variant" and not r.get("failed"):
        k = (r["precision"], r["variant"])
        if k not in variants or r["ms"] < variants[k]["ms"]:
            variants[k] = r
rows = []
for r in lines("compare/speed.jsonl"):
    rows.append(("eager", r))
for r in lines("more.jsonl"):
    mode = "graph" if r.get("graph") else ("atomic SGD" if any("deterministic=false" in s for s in r.get("sets") or []) else "eager")
    rows.append((mode, r))
if rows:
    print("\nB3: dlrm_mlperf_v1_2m, batch 65536 (target: bf16 >= 10 M samples/s and >= 3x the faster PyTorch)")
    print(f"  {'math':5} {'mode':11} {'ms':>8} {'M/s':>7} {'of 10M':>7} {'floor ms':>9} {'plain M/s':>10} {'expert M/s':>11} {'x faster':>9}")
    for mode, r in rows:
        p = r["precision"]
        pl, ex = variants.get((p, "plain")), variants.get((p, "expert"))
        faster = min([v["ms"] for v in (pl, ex) if v] or [float("nan")])
        f = lambda v: f"{v['samples_per_s'] / 1e6:.3f}" if v else "-"
        print(f"  {p:5} {mode:11} {r['ms']:8.3f} {r['samples_per_s'] / 1e6:7.3f} {r['samples_per_s'] / 1e5:6.0f}% "
              f"{(r.get('floor_ms') or float('nan')):9.3f} {f(pl):>10} {f(ex):>11} {faster / r['ms']:9.2f}")
    for mode, r in rows:
        if r["precision"] != "bf16" or mode != "eager":
            continue
        print(f"\n  uvmrec bf16 step by phase (each alone), {r.get('unique_rows')} distinct rows a batch:")
        print(f"  {'phase':12} {'ms':>8} {'floor ms':>9} {'% floor':>8}")
        for ph in r.get("phases", []):
            fl = ph.get("floor_ms")
            print(f"  {ph['name']:12} {ph['ms']:8.3f} {fl if fl is not None else float('nan'):9.3f} "
                  f"{(100 * fl / ph['ms']) if fl else float('nan'):7.0f}%")
        print(f"  {'gaps':12} {r.get('gaps_ms', float('nan')):8.3f}")
b2 = lines("b2.jsonl")
if b2:
    print("\nB2: 26 tables x dim 128 f32 in HBM, batch 65536 (target: forward + backward >= 70% of the copy ceiling)")
    print(f"  {'case':34} {'op':26} {'ms':>8} {'GB/s':>8} {'of copy':>8}")
    for r in b2:
        print(f"  {r['case']:34} {r['op']:26} {r['ms']:8.3f} {r['gbps']:8.1f} {100 * r['gbps'] * 1e9 / COPY:7.1f}%")
print()
PY
echo "== done ($(( $(date +%s) - t0 )) s, exit $fail)"
exit $fail
