# Sourced by the pending GPU scripts of this folder (run from the repository root): BUILD (default build/gpu), T (the
# test binary), tmo (a timeout capped by the script's deadline, PENDING_BUDGET_S seconds after the start, default 44)
# and conformance_cases (the CUDA implementations of one op on the given atk cases).
BUILD=${BUILD:-build/gpu}
T=$BUILD/tests/strata_tests
END=$((SECONDS + ${PENDING_BUDGET_S:-44}))
# tmo CAP_S CMD...: CMD with a timeout of CAP_S seconds or what is left before the deadline, whichever is less.
tmo() { local r=$((END - SECONDS)); ((r > $1)) && r=$1; ((r < 1)) && r=1; timeout $r "${@:2}"; }
# conformance_cases OP CAP_S CASE...: each atk case alone (STRATA_ATK_CASE) through the conformance test on the CUDA
# implementations, CAP_S seconds each; one line per implementation, prefixed by the case's dtype, shape and seed.
conformance_cases() {
  local op=$1 cap=$2 c
  shift 2
  for c in "$@"; do
    STRATA_CONFORMANCE_DEVICES=cuda STRATA_ATK_CASE="$op $c" tmo "$cap" $T \
      --gtest_filter="Ops/Conformance.EveryImplementationMatchesFloat64/$op" 2>&1 \
      | grep -E '^\[conformance\]|impl=' | head -4 | cut -c1-300 | sed "s|^|[${c%% cu=*} ${c##*seed=}] |"
  done
}
