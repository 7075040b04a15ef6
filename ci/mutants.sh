#!/usr/bin/env bash
# Mutation testing of the core pure modules (issue 17) with cargo-mutants
# (https://mutants.rs; install: cargo install --locked cargo-mutants).
#
#   bash ci/mutants.sh            # every group below
#   MUTANTS_RE='search.rs:(247|248):' bash ci/mutants.sh search   # only the matching mutants
#   bash ci/mutants.sh policy     # one group (policy, rebalance, divisor, compute_log, tune (= recommend + search), checkpoint, trace, tune_more)
#
# One job (`--jobs 1`), no baseline (the suite is known to pass; timeouts are explicit), each
# mutant built in a copy of the tree (never in the worktree) but into this worktree's target
# directory (CARGO_TARGET_DIR) with the cargo profile `mutants` (Cargo.toml): its artifacts live
# in target/mutants, apart from the worktree's dev/test artifacts, which a mutated copy would
# otherwise overwrite (same unit names: cargo hashes workspace members by their path relative to
# the workspace). The first run builds the dependencies once for that profile. The test command is the
# library's unit tests and proptests (`--lib`), plus `--test checkpoint` for the checkpoint codec
# (its tests live there).
#
# Prints caught / viable per group and in total (viable = caught + missed + timeout; unviable
# mutants do not build and count for nothing). Survivors: target/mutants-report/<group>/mutants.out/missed.txt.
# Not part of .ci/run: too slow for 2 cores. Measured 2026-11-30 on 2 cores shared with other
# builds: 20-25 s per mutant (one incremental build of the library's test binary + ~1 s of
# tests); policy (38 mutants) ~13 min, divisor (9) 7 min including the first build of the
# workspace crates under the `mutants` profile, compute_log (80) 32 min, recommend (48) 14 min;
# every group (~800 mutants: search 147, trace 188, tune_more 202, checkpoint 92) about 5 hours.
# The dependencies' first build under the `mutants` profile adds ~10 minutes once.
# 2026-11-30 (second session, load average 12-15 from 5 parallel builds): checkpoint's first
# mutant hit the 900 s build timeout (the profile's first build), the next four took 70-690 s
# to build; the run was stopped after 5 of 92 mutants (39 min): 3 caught, `list` -> "xyzzy"
# missed and `list` -> String::new() a build timeout, both now pinned by
# tests/checkpoint.rs (the NoCheckpoint message, exact). On a loaded machine run one group at
# a time when the machine is otherwise idle.
# 2026-12-01 (one other build at times): checkpoint 73 / 86 viable caught (84.9 %) in 1502 s,
# search 121 / 147 (82.3 %) in 1363 s (~10-16 s per mutant once the profile is built). Tests
# were added for every survivor (tests/checkpoint.rs: exact structural errors behind a valid
# checksum, step_of, valid_steps; core/src/tune/search.rs: saving, batch fraction, headroom, zero
# steps, verdict boundaries); re-running the mutants of the survivors' lines (MUTANTS_RE):
# checkpoint 25 + 7 / 25 + 7 caught (219 s + 89 s), search 49 / 49 (283 s): no survivor left.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! cargo mutants --version >/dev/null 2>&1; then
  echo "cargo-mutants is not installed: cargo install --locked cargo-mutants" >&2
  exit 2
fi

group_files() {
  case "$1" in
    policy) echo "core/src/policy/mod.rs" ;; # decide and the estimator (was core/src/policy.rs)
    rebalance) echo "core/src/policy/rebalance.rs core/src/policy/kind.rs" ;;
    divisor) echo "core/src/schedule/divisor.rs" ;;
    compute_log) echo "core/src/trace/compute_log.rs" ;;
    trace) echo "core/src/trace/mod.rs core/src/trace/whatif.rs" ;;
    tune) echo "core/src/tune/search.rs core/src/tune/recommend.rs" ;;
    recommend) echo "core/src/tune/recommend.rs" ;;
    search) echo "core/src/tune/search.rs" ;;
    tune_more) echo "core/src/tune/reduce.rs core/src/tune/retune.rs core/src/tune/straggler.rs" ;;
    checkpoint) echo "core/src/checkpoint.rs" ;;
    *) echo "unknown group $1" >&2; exit 2 ;;
  esac
}
# Test targets, as cargo arguments: cargo-mutants passes `--cargo-arg`s to both the build
# (`cargo test --no-run`) and the test run, unlike arguments after `--` (test run only).
group_tests() {
  case "$1" in
    # tests/checkpoint.rs belongs to the root crate (dropcompute-cli), the code to the core.
    checkpoint) echo "--test-workspace=true --cargo-arg=--lib --cargo-arg=--test=checkpoint" ;;
    *) echo "--cargo-arg=--lib" ;;
  esac
}

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(policy divisor compute_log tune checkpoint trace tune_more)

start=$(date +%s)
total_caught=0; total_viable=0
for g in "${groups[@]}"; do
  args=()
  for f in $(group_files "$g"); do args+=(-f "$f"); done
  out="$root/target/mutants-report/$g"
  # MUTANTS_RE=REGEX: only the mutants whose name matches (e.g. a previous run's survivors:
  # "checkpoint.rs:(159|212):"), reported under <group>-re so the full run's report stays.
  if [ -n "${MUTANTS_RE:-}" ]; then args+=(--re "$MUTANTS_RE"); out="$out-re"; fi
  mkdir -p "$out"
  t0=$(date +%s)
  # shellcheck disable=SC2046
  CARGO_TARGET_DIR="$root/target" cargo mutants "${args[@]}" --profile mutants --jobs 1 --no-shuffle --baseline skip \
    --timeout 120 --build-timeout 900 --output "$out" $(group_tests "$g") >"$out/console.txt" 2>&1 || true
  o="$out/mutants.out"
  n() { if [ -f "$o/$1.txt" ]; then grep -c . "$o/$1.txt" || true; else echo 0; fi; }
  caught=$(n caught); missed=$(n missed); timeout=$(n timeout); unviable=$(n unviable)
  viable=$((caught + missed + timeout))
  total_caught=$((total_caught + caught + timeout)); total_viable=$((total_viable + viable))
  pct=$(awk -v c=$((caught + timeout)) -v v=$viable 'BEGIN { printf "%.1f", v ? 100 * c / v : 0 }')
  echo "$g: caught $((caught + timeout)) / viable $viable ($pct %; $timeout by timeout; $unviable unviable) in $(( $(date +%s) - t0 )) s"
  [ "$missed" -gt 0 ] && sed 's/^/  missed: /' "$o/missed.txt"
done
pct=$(awk -v c=$total_caught -v v=$total_viable 'BEGIN { printf "%.1f", v ? 100 * c / v : 0 }')
echo "total: caught $total_caught / viable $total_viable ($pct %) in $(( $(date +%s) - start )) s"
