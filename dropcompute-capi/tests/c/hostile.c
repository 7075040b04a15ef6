/* Hostile inputs from a real C host: every entry point x {null pointer, zero length,
 * SIZE_MAX / huge length, a directory, a missing file, an empty file} as applies. Each case
 * asserts the status, that the out-pointer was reset (it held a stale value before) and, for
 * tests/c_program.rs, that nothing reaches stderr (no panic message, no backtrace): this
 * program writes to stderr only when a check fails. Prints "ok NAME" per case; exit 0 = all.
 * Usage: hostile DIR MISSING EMPTY TRACE(2 ranks x 4 micro-batches x 12 steps) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "dropcompute.h"

static int failures = 0;

#define CASE(name, cond)                                                            \
  do {                                                                              \
    if (cond) {                                                                     \
      printf("ok %s\n", name);                                                      \
    } else {                                                                        \
      fprintf(stderr, "FAILED %s: %s (line %d): last error '%s'\n", name, #cond,    \
              __LINE__, dc_last_error());                                           \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

static int has(const char *needle) { return strstr(dc_last_error(), needle) != NULL; }

static void stale_rec(DcRecommendation *r) {
  memset(r, 0x5a, sizeof *r);
  r->enabled = true;
  r->reason[DC_REASON_LEN - 1] = 0;
}

static int rec_zero(const DcRecommendation *r) {
  if (r->enabled || r->threshold_ns != 0.0 || r->predicted_drop_rate != 0.0 ||
      r->predicted_speedup != 0.0 || r->refusal != DC_REFUSAL_NONE)
    return 0;
  for (size_t i = 0; i < DC_REASON_LEN; i++)
    if (r->reason[i] != 0) return 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: hostile DIR MISSING EMPTY TRACE\n"); return 2; }
  const char *dir = argv[1], *missing = argv[2], *empty = argv[3], *trace = argv[4];
  void *const STALE = (void *)&failures; /* a non-null handle value left by an earlier call */

  /* dc_policy_new */
  DcPolicy *p = (DcPolicy *)STALE;
  CASE("policy_new null out", dc_policy_new(1, DC_CHECK_BEFORE, 0, 1, NULL) == DC_INVALID_ARGUMENT &&
                                  has("out: null pointer"));
  CASE("policy_new bad check_mode", dc_policy_new(1, 7, 0, 1, &p) == DC_INVALID_ARGUMENT && p == NULL &&
                                        has("check_mode 7"));
  CASE("policy_new", dc_policy_new(100, DC_CHECK_PREDICTIVE, 0, 1, &p) == DC_OK && p != NULL);

  /* dc_policy_should_start */
  bool start = true;
  CASE("should_start null policy", dc_policy_should_start(NULL, 0, 0, 0, 0, &start) == DC_INVALID_ARGUMENT &&
                                       !start && has("policy: null pointer"));
  CASE("should_start null out", dc_policy_should_start(p, 0, 0, 0, 0, NULL) == DC_INVALID_ARGUMENT &&
                                    has("out: null pointer"));

  /* dc_estimator_new */
  DcEstimator *e = (DcEstimator *)STALE;
  CASE("estimator_new null out", dc_estimator_new(4, 0.9, NULL) == DC_INVALID_ARGUMENT);
  CASE("estimator_new window 0", dc_estimator_new(0, 0.9, &e) == DC_INVALID_ARGUMENT && e == NULL &&
                                     has("window 0"));
  e = (DcEstimator *)STALE;
  CASE("estimator_new window SIZE_MAX", dc_estimator_new(SIZE_MAX, 0.9, &e) == DC_INVALID_ARGUMENT &&
                                            e == NULL && has("DC_MAX_ESTIMATOR_WINDOW"));
  e = (DcEstimator *)STALE;
  CASE("estimator_new quantile 2", dc_estimator_new(4, 2.0, &e) == DC_INVALID_ARGUMENT && e == NULL &&
                                       has("quantile 2"));

  /* dc_walk_new */
  DcWalk *w = (DcWalk *)STALE;
  CASE("walk_new null policy", dc_walk_new(NULL, 0, 4, 0, &w) == DC_INVALID_ARGUMENT && w == NULL &&
                                   has("policy: null pointer"));
  CASE("walk_new null out", dc_walk_new(p, 0, 4, 0, NULL) == DC_INVALID_ARGUMENT);
  w = (DcWalk *)STALE;
  CASE("walk_new micro_batches UINT32_MAX", dc_walk_new(p, 0, UINT32_MAX, 0, &w) == DC_INVALID_ARGUMENT &&
                                                w == NULL && has("micro_batches 4294967295"));
  CASE("walk_new zero micro_batches", dc_walk_new(p, 0, 0, 0, &w) == DC_OK && w != NULL);

  /* dc_walk_next / ended / clock_at / reported on the zero-length walk and null handles */
  uint32_t kind = DC_WALK_LAUNCH;
  uint64_t value = 77;
  CASE("walk_next zero length", dc_walk_next(w, NULL, &kind, &value) == DC_OK && kind == DC_WALK_DONE &&
                                    value == 0);
  kind = DC_WALK_LAUNCH;
  value = 77;
  CASE("walk_next null walk", dc_walk_next(NULL, NULL, &kind, &value) == DC_INVALID_ARGUMENT &&
                                  kind == DC_WALK_DONE && value == 0 && has("walk: null pointer"));
  value = 77;
  CASE("walk_next null kind", dc_walk_next(w, NULL, NULL, &value) == DC_INVALID_ARGUMENT && value == 0);
  CASE("walk_ended null walk", dc_walk_ended(NULL, NULL, 0, 1, 1) == DC_INVALID_ARGUMENT);
  CASE("walk_ended UINT64_MAX", dc_walk_ended(w, NULL, UINT64_MAX, 1, 1) == DC_INVALID_ARGUMENT &&
                                    has("launch 18446744073709551615"));
  CASE("walk_clock_at null walk", dc_walk_clock_at(NULL, 1) == DC_INVALID_ARGUMENT);
  CASE("walk_reported null walk", dc_walk_reported(NULL) == 0);
  dc_walk_free(w);
  dc_walk_free(NULL);
  dc_estimator_free(NULL);
  dc_policy_free(NULL);

  /* dc_divisor */
  uint64_t counts[2] = {3, 4};
  double d = 7;
  CASE("divisor null out", dc_divisor(counts, 2, DC_NORMALIZATION_REALIZED, 4, 3, NULL) == DC_INVALID_ARGUMENT);
  CASE("divisor null counts", dc_divisor(NULL, 2, DC_NORMALIZATION_REALIZED, 4, 3, &d) == DC_INVALID_ARGUMENT &&
                                  d == 0 && has("counts: null pointer"));
  d = 7;
  CASE("divisor zero length", dc_divisor(NULL, 0, DC_NORMALIZATION_REALIZED, 4, 3, &d) == DC_SKIP_STEP && d == 0);
  d = 7;
  CASE("divisor SIZE_MAX", dc_divisor(counts, SIZE_MAX, DC_NORMALIZATION_REALIZED, 4, 3, &d) ==
                               DC_INVALID_ARGUMENT && d == 0 && has("world_size 18446744073709551615"));
  d = 7;
  CASE("divisor cap + 1", dc_divisor(counts, DC_MAX_WORLD_SIZE + 1, DC_NORMALIZATION_REALIZED, 4, 3, &d) ==
                              DC_INVALID_ARGUMENT && d == 0 && has("DC_MAX_WORLD_SIZE"));
  d = 7;
  CASE("divisor nominal M 0", dc_divisor(counts, 2, DC_NORMALIZATION_NOMINAL, 0, 3, &d) == DC_INVALID_ARGUMENT &&
                                  d == 0 && has("micro_batches 0"));
  d = 7;
  CASE("divisor nominal b 0", dc_divisor(counts, 2, DC_NORMALIZATION_NOMINAL, 4, 0, &d) == DC_INVALID_ARGUMENT &&
                                  d == 0 && has("micro_batch_size 0"));
  CASE("divisor nominal", dc_divisor(counts, 2, DC_NORMALIZATION_NOMINAL, 4, 3, &d) == DC_OK && d == 24.0);

  /* dc_recommend_file */
  DcRecommendation r;
  stale_rec(&r);
  CASE("recommend null path", dc_recommend_file(NULL, UINT32_MAX, NULL, 1, &r) == DC_INVALID_ARGUMENT &&
                                  rec_zero(&r) && has("path: null pointer"));
  CASE("recommend null out", dc_recommend_file(trace, UINT32_MAX, NULL, 1, NULL) == DC_INVALID_ARGUMENT);
  stale_rec(&r);
  CASE("recommend directory", dc_recommend_file(dir, UINT32_MAX, NULL, 1, &r) == DC_IO && rec_zero(&r) &&
                                  has("is a directory"));
  stale_rec(&r);
  CASE("recommend missing file", dc_recommend_file(missing, UINT32_MAX, NULL, 1, &r) == DC_IO && rec_zero(&r) &&
                                     has(missing));
  stale_rec(&r);
  CASE("recommend empty file", dc_recommend_file(empty, UINT32_MAX, NULL, 1, &r) == DC_TRACE && rec_zero(&r) &&
                                   has("unrecognised header"));
  stale_rec(&r);
  CASE("recommend min_micro_batches > M", dc_recommend_file(trace, DC_CHECK_BEFORE, NULL, 5, &r) ==
                                              DC_INVALID_ARGUMENT && rec_zero(&r) &&
                                              has("min_micro_batches 5: must be <="));
  stale_rec(&r);
  CASE("recommend min_micro_batches UINT32_MAX", dc_recommend_file(trace, UINT32_MAX, NULL, UINT32_MAX, &r) ==
                                                     DC_INVALID_ARGUMENT && rec_zero(&r));
  CASE("recommend ok", dc_recommend_file(trace, UINT32_MAX, NULL, 1, &r) == DC_OK && r.enabled);
  CASE("last error cleared", strcmp(dc_last_error(), "") == 0);

  /* The length calls: null and huge lengths, unknown kinds and buckets, outs reset. */
  uint32_t lens[2] = {64, 128};
  DcPolicy *lp = (DcPolicy *)&failures;
  CASE("policy_new_kind null kind", dc_policy_new_kind(NULL, 1, 0, 1, lens, 2, &lp) == DC_INVALID_ARGUMENT &&
                                        lp == NULL && has("kind: null pointer"));
  lp = (DcPolicy *)&failures;
  CASE("policy_new_kind unknown kind", dc_policy_new_kind("fastest", 1, 0, 1, lens, 2, &lp) ==
                                           DC_INVALID_ARGUMENT && lp == NULL && has("kind \"fastest\""));
  CASE("policy_new_kind SIZE_MAX lengths", dc_policy_new_kind("cost-balance", 1, 0, 1, lens, SIZE_MAX, &lp) ==
                                               DC_INVALID_ARGUMENT && lp == NULL && has("exceeds BucketTokens::MAX"));
  CASE("policy_new_kind null lengths", dc_policy_new_kind("cost-balance", 1, 0, 1, NULL, 2, &lp) ==
                                           DC_INVALID_ARGUMENT && lp == NULL);
  CASE("policy_new_kind ok", dc_policy_new_kind("cost-balance", 1, 0, 1, lens, 2, &lp) == DC_OK && lp != NULL);
  DcWalk *lw = NULL;
  CASE("walk_new of a kind", dc_walk_new(lp, 0, 2, 0, &lw) == DC_OK && lw != NULL);
  uint32_t bk[2] = {0, 2};
  uint64_t tk[2] = {10, 20}, tok = 99;
  CASE("set_micro_batches unknown bucket", dc_walk_set_micro_batches(lw, bk, tk, 2) == DC_INVALID_ARGUMENT &&
                                               has("buckets [1] 2"));
  CASE("set_micro_batches SIZE_MAX", dc_walk_set_micro_batches(lw, bk, tk, SIZE_MAX) == DC_INVALID_ARGUMENT);
  CASE("set_micro_batches null tokens", dc_walk_set_micro_batches(lw, bk, NULL, 2) == DC_INVALID_ARGUMENT);
  CASE("set_micro_batches null walk", dc_walk_set_micro_batches(NULL, bk, tk, 2) == DC_INVALID_ARGUMENT);
  CASE("tokens_started null walk", dc_walk_tokens_started(NULL, &tok) == DC_INVALID_ARGUMENT && tok == 0);
  CASE("estimator_estimate null", dc_estimator_estimate(NULL, DC_NO_BUCKET, &tok) == DC_INVALID_ARGUMENT);
  CASE("divisor_weighted unknown weighting",
       dc_divisor_weighted(counts, 2, DC_NORMALIZATION_REALIZED, 9, 4, 3, &d) == DC_INVALID_ARGUMENT && d == 0);
  dc_walk_free(lw);
  dc_policy_free(lp);

  /* dc_guard_*: the run-time drop-rate guard. */
  DcGuard *gd = (DcGuard *)STALE;
  uint32_t yes = 7;
  CASE("guard_new null out", dc_guard_new(0.1, NULL) == DC_INVALID_ARGUMENT && has("out: null pointer"));
  CASE("guard_new bound 0", dc_guard_new(0.0, &gd) == DC_INVALID_ARGUMENT && gd == NULL && has("bound 0"));
  gd = (DcGuard *)STALE;
  CASE("guard_new bound 1.5", dc_guard_new(1.5, &gd) == DC_INVALID_ARGUMENT && gd == NULL && has("bound 1.5"));
  gd = (DcGuard *)STALE;
  CASE("guard_new bound NaN", dc_guard_new(0.0 / 0.0, &gd) == DC_INVALID_ARGUMENT && gd == NULL);
  CASE("guard_new bound -1", dc_guard_new(-1.0, &gd) == DC_INVALID_ARGUMENT && gd == NULL);
  CASE("guard_enforces null guard", dc_guard_enforces(NULL, 32, &yes) == DC_INVALID_ARGUMENT && yes == 0 &&
                                        has("drop_guard: null pointer"));
  CASE("guard_record null guard", dc_guard_record(NULL, 32, 30, 1) == DC_INVALID_ARGUMENT);
  CASE("guard_new", dc_guard_new(0.1, &gd) == DC_OK && gd != NULL);
  CASE("guard_enforces null out", dc_guard_enforces(gd, 32, NULL) == DC_INVALID_ARGUMENT);
  /* The rule by hand (policy::guard's test), bound 0.1, 32 handed per step: step 0 enforces and
   * drops 4 (reserve 4); step 1: 4 + 4 <= 6.4? no: off, drops 0; step 2: 4 + 4 <= 9.6: enforced,
   * drops 2; step 3: 6 + 4 <= 12.8: enforced. A started count above the handed one drops nothing. */
  CASE("guard step 0", dc_guard_enforces(gd, 32, &yes) == DC_OK && yes == 1 && dc_guard_record(gd, 32, 28, 1) == DC_OK);
  CASE("guard step 1", dc_guard_enforces(gd, 32, &yes) == DC_OK && yes == 0 && dc_guard_record(gd, 32, 32, 0) == DC_OK);
  CASE("guard step 2", dc_guard_enforces(gd, 32, &yes) == DC_OK && yes == 1 && dc_guard_record(gd, 32, 30, 1) == DC_OK);
  CASE("guard step 3", dc_guard_enforces(gd, 32, &yes) == DC_OK && yes == 1 && dc_guard_record(gd, 32, 99, 1) == DC_OK);
  CASE("guard step 4", dc_guard_enforces(gd, 0, &yes) == DC_OK && yes == 1);
  CASE("guard handed UINT64_MAX", dc_guard_enforces(gd, UINT64_MAX, &yes) == DC_OK && yes == 1);
  dc_guard_free(gd);
  dc_guard_free(NULL);

  dc_policy_free(p);
  return failures == 0 ? 0 : 1;
}
