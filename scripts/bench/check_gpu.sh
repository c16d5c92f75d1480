#!/bin/sh
# Issue #27's correctness run on one GPU, from a `make dist` tree's root (it builds nothing):
#   1. `uvmrec --version`, then the whole #cuda suite (`spec/run.lua --tags=cuda`, UVMREC_REQUIRE_GPU=1)
#   2. compute-sanitizer memcheck on every spec file holding #cuda specs, and racecheck on those
#      whose kernels use shared memory or atomics, each with the JIT off (`-e 'jit.off()'`: the
#      sanitizer then sees the engine's calls, not traces), each file under a time limit (LIMIT
#      seconds; a file that runs past it is reported as such, never as clean)
#   3. one table: spec counts, and per sanitized file its errors or its time-out
#   sh scripts/bench/check_gpu.sh [OUT]   (env: UVMREC, SAN, LIMIT, DEADLINE, MEMCHECK, RACECHECK)
# DEADLINE: seconds after the start past which no file is started (listed as not run), so that
# the call ends inside the device's 10 minutes.
# MEMCHECK and RACECHECK name the spec files (defaults below; "none" for none); ONLY="suite memcheck
# racecheck".  Under the sanitizer UVMREC_SANITIZER=1 tells specs to leave out their timings.
out=${1:-check-out}
UVMREC=${UVMREC:-bin/uvmrec}
SAN=${SAN:-compute-sanitizer}
LIMIT=${LIMIT:-90}
DEADLINE=${DEADLINE:-540}   # seconds from the start after which no further file is started
t0=$(date +%s)
ONLY=${ONLY:-suite memcheck racecheck}
MEMCHECK=${MEMCHECK:-$(grep -l -e '#cuda' -e 'cuda_it' spec/*_spec.lua spec/*/*_spec.lua | sort)}
# kernels with shared memory or atomics: interaction and the MLP chain (dense), the tables'
# backward and atomic SGD (tbe), the cache, KJT sorts and dedup, the loader on the GPU and the
# generator, adaptive swaps (hints), metrics, quantized lookups and collisions where present,
# the far rows' copies (the forward's map, claimed by atomics)
RACECHECK=${RACECHECK:-$(ls spec/dense_cuda_spec.lua spec/tbe_cuda_spec.lua spec/cache_cuda_spec.lua \
  spec/kjt_cuda_spec.lua spec/data/generator_spec.lua spec/hints_cuda_spec.lua spec/metrics_spec.lua \
  spec/qtbe_cuda_spec.lua spec/mc_spec.lua spec/nan_spec.lua spec/tbe_far_spec.lua 2>/dev/null)}
mkdir -p "$out"
table="$out/table.txt"
: > "$table"
fail=0
case " $ONLY " in *" suite "*)
  "$UVMREC" --version
  start=$(date +%s)
  UVMREC_REQUIRE_GPU=1 "$UVMREC" spec/run.lua --tags=cuda > "$out/suite.log" 2>&1
  rc=$?
  grep -B2 -A12 -e '^FAILED' -e '^ERROR' "$out/suite.log" | head -80
  printf '%-44s %s (%d s)\n' "#cuda suite" "$(tail -1 "$out/suite.log")" $(($(date +%s) - start)) >> "$table"
  [ $rc -eq 0 ] || fail=1 ;;
esac
# san TOOL FILE: one file under the sanitizer, its result appended to the table
san() {
  tool=$1 file=$2
  if [ $(($(date +%s) - t0)) -ge "$DEADLINE" ]; then
    printf '%-10s %-34s %s\n' "$tool" "$file" "NOT RUN: past the call's DEADLINE of $DEADLINE s" >> "$table"
    fail=1
    return
  fi
  left=$((DEADLINE + LIMIT - $(date +%s) + t0))
  [ "$left" -lt "$LIMIT" ] && LIMIT_NOW=$left || LIMIT_NOW=$LIMIT
  log="$out/$tool-$(echo "$file" | tr '/' '_').log"
  start=$(date +%s)
  UVMREC_REQUIRE_GPU=1 UVMREC_SANITIZER=1 timeout "$LIMIT_NOW" "$SAN" --tool "$tool" --error-exitcode 99 \
    "$UVMREC" -e 'jit.off()' spec/run.lua --tags=cuda "$file" > "$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  errs=$(grep -c -e '^========= Invalid' -e '^========= Race' -e 'hazard' "$log")
  summary=$(grep -E '^[0-9]+ passed' "$log" | tail -1)
  ran=$(echo "$summary" | awk '{print $1 + 0}')
  case $rc in
    0) if [ "${ran:-0}" -gt 0 ]; then what="clean: ${summary}"; else what="NO SPEC RAN: '${summary}'"; fail=1; fi ;;
    124) what="TIMED OUT after ${LIMIT_NOW} s (not checked to the end)"; fail=1 ;;
    99) what="ERRORS: $errs reported: $(grep -m1 -e '^========= ' "$log" | cut -c1-80)"; fail=1 ;;
    *) what="FAILED rc=$rc: ${summary}"; fail=1 ;;
  esac
  printf '%-10s %-34s %s (%d s)\n' "$tool" "$file" "$what" "$secs" >> "$table"
}
[ "$MEMCHECK" = none ] && MEMCHECK=
[ "$RACECHECK" = none ] && RACECHECK=
case " $ONLY " in *" memcheck "*) for f in $MEMCHECK; do san memcheck "$f"; done ;; esac
case " $ONLY " in *" racecheck "*) for f in $RACECHECK; do san racecheck "$f"; done ;; esac
echo "== table"
cat "$table"
exit $fail
