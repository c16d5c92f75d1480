# shellcheck shell=sh
# The steps of the GPU run scripts (cache_gpu.sh, uvm_gpu.sh, dist_gpu.sh, scale_gpu.sh), sourced:
#   . "$(dirname "$0")/steps.sh"
#   step NAME CMD...   runs CMD (when ONLY is unset or names NAME), records its exit status and
#                      seconds; a failed step makes the script fail
#   steps_end          prints every step's status and exits non-zero if any step failed
summary=""
fail=0
step() {
  name=$1
  shift
  if [ -n "${ONLY:-}" ]; then
    case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  fi
  echo "== $name: $*"
  start=$(date +%s)
  "$@"
  rc=$?
  summary="$summary
$name: rc=$rc, $(($(date +%s) - start)) s"
  [ $rc -eq 0 ] || fail=1
}
steps_end() {
  echo "== summary$summary"
  exit $fail
}
