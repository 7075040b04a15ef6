/* Uses the C API the way a C training stack would: a policy, a recommendation from a trace
 * file, the divisor. Checks what it can know by itself and prints the rest as key=value lines
 * for tests/c_program.rs to compare with the Rust library. Exit 0 = every check passed. */
#include <stdio.h>
#include <string.h>
#include "dropcompute.h"

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "check failed: %s (line %d): last error '%s'\n",     \
              #cond, __LINE__, dc_last_error());                           \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: program TRACE\n"); return 2; }
  /* Policy: 100 ns, check before each micro-batch, 1 warm-up step, 1 micro-batch minimum. */
  DcPolicy *p = NULL;
  CHECK(dc_policy_new(100, DC_CHECK_BEFORE, 1, 1, &p) == DC_OK && p != NULL);
  bool start = false;
  CHECK(dc_policy_should_start(p, 5, 3, 99, 0, &start) == DC_OK && start);
  CHECK(dc_policy_should_start(p, 5, 3, 100, 0, &start) == DC_OK && !start);
  CHECK(dc_policy_should_start(p, 0, 3, 1000, 0, &start) == DC_OK && start);  /* warm-up */
  CHECK(dc_policy_should_start(p, 5, 0, 1000, 0, &start) == DC_OK && start);  /* minimum */
  dc_policy_free(p);
  CHECK(dc_policy_new(100, DC_CHECK_PREDICTIVE, 0, 0, &p) == DC_OK);
  CHECK(dc_policy_should_start(p, 5, 3, 60, 40, &start) == DC_OK && start);
  CHECK(dc_policy_should_start(p, 5, 3, 60, 41, &start) == DC_OK && !start);
  CHECK(dc_policy_should_start(NULL, 5, 3, 60, 41, &start) == DC_INVALID_ARGUMENT);
  CHECK(strcmp(dc_last_error(), "policy: null pointer") == 0);
  dc_policy_free(p);
  CHECK(dc_policy_new(100, 7, 0, 0, &p) == DC_INVALID_ARGUMENT);
  CHECK(strstr(dc_last_error(), "check_mode 7") != NULL);

  /* The scheduler's walk: predictive at 35 ns, micro-batches of 10 ns, an estimator kept across
   * steps: the first micro-batch starts without an estimate, then 10 ns is the estimate and
   * the 4th would end at 40 > 35: 3 start in each step, the deadline ends it. */
  CHECK(dc_policy_new(35, DC_CHECK_PREDICTIVE, 0, 1, &p) == DC_OK);
  DcEstimator *e = NULL;
  CHECK(dc_estimator_new(32, 0.9, &e) == DC_OK && e != NULL);
  for (uint64_t step = 0; step < 2; step++) {
    DcWalk *w = NULL;
    CHECK(dc_walk_new(p, step, 4, 0, &w) == DC_OK && w != NULL);
    uint64_t ends[8] = {0}, launched = 0, value = 0;
    uint32_t kind = 0;
    for (;;) {
      CHECK(dc_walk_next(w, e, &kind, &value) == DC_OK);
      if (kind == DC_WALK_DONE) break;
      if (kind == DC_WALK_LAUNCH) {
        CHECK(value == launched);
        ends[launched] = (launched ? ends[launched - 1] : 0) + 10;
        launched++;
        continue;
      }
      for (uint64_t i = dc_walk_reported(w); i < value; i++) CHECK(dc_walk_ended(w, e, i, ends[i], 10) == DC_OK);
    }
    CHECK(launched == 3 && value == 1);
    CHECK(dc_walk_ended(w, e, 0, 10, 10) == DC_INVALID_ARGUMENT); /* reported already */
    dc_walk_free(w);
  }
  dc_estimator_free(e);
  CHECK(dc_estimator_new(0, 0.9, &e) == DC_INVALID_ARGUMENT && e == NULL);
  CHECK(dc_walk_next(NULL, NULL, NULL, NULL) == DC_INVALID_ARGUMENT);
  dc_policy_free(p);

  /* Divisor. */
  uint64_t counts[3] = {12, 0, 5};
  double d = 0;
  CHECK(dc_divisor(counts, 3, DC_NORMALIZATION_REALIZED, 4, 3, &d) == DC_OK && d == 17.0);
  CHECK(dc_divisor(counts, 3, DC_NORMALIZATION_NOMINAL, 4, 3, &d) == DC_OK && d == 36.0);
  uint64_t zeros[2] = {0, 0};
  CHECK(dc_divisor(zeros, 2, DC_NORMALIZATION_REALIZED, 4, 3, &d) == DC_SKIP_STEP);

  /* The library's layout is the header's. */
  CHECK(dc_abi_version() == DC_ABI_VERSION && DC_ABI_VERSION == 2);

  /* Recommendation. */
  DcRecommendation r;
  CHECK(dc_recommend_file("/nonexistent/trace.csv", UINT32_MAX, NULL, 1, &r) == DC_IO);
  CHECK(strstr(dc_last_error(), "/nonexistent/trace.csv") != NULL);
  DcGuardrails g = dc_guardrails_default();
  g.max_drop_rate = 1.5;
  CHECK(dc_recommend_file(argv[1], UINT32_MAX, &g, 1, &r) == DC_INVALID_ARGUMENT);
  CHECK(strstr(dc_last_error(), "guardrails.max_drop_rate") != NULL);
  CHECK(dc_recommend_file(argv[1], UINT32_MAX, NULL, 1, &r) == DC_OK);
  printf("oracle enabled=%d threshold_ns=%.17g drop_rate=%.17g speedup=%.17g refusal=%u reason=%s\n",
         r.enabled, r.threshold_ns, r.predicted_drop_rate, r.predicted_speedup, r.refusal, r.reason);
  g = dc_guardrails_default();
  g.max_drop_rate = 0.0;
  CHECK(dc_recommend_file(argv[1], DC_CHECK_BEFORE, &g, 1, &r) == DC_OK);
  printf("strict enabled=%d threshold_ns=%.17g drop_rate=%.17g speedup=%.17g refusal=%u reason=%s\n",
         r.enabled, r.threshold_ns, r.predicted_drop_rate, r.predicted_speedup, r.refusal, r.reason);
  /* The jitter window (tune::Guardrails::jitter_ns): a finite number of ns >= 0, replayed only. */
  g = dc_guardrails_default();
  g.jitter_ns = -1.0;
  CHECK(dc_recommend_file(argv[1], DC_CHECK_BEFORE, &g, 1, &r) == DC_INVALID_ARGUMENT);
  CHECK(strstr(dc_last_error(), "guardrails.jitter_ns") != NULL);
  g.jitter_ns = 1e6;
  g.max_drop_rate = 0.3;
  CHECK(dc_recommend_file(argv[1], UINT32_MAX, &g, 1, &r) == DC_INVALID_ARGUMENT);
  CHECK(strstr(dc_last_error(), "replayed") != NULL);
  CHECK(dc_recommend_file(argv[1], DC_CHECK_BEFORE, &g, 1, &r) == DC_OK);
  printf("jitter enabled=%d threshold_ns=%.17g drop_rate=%.17g speedup=%.17g refusal=%u reason=%s\n",
         r.enabled, r.threshold_ns, r.predicted_drop_rate, r.predicted_speedup, r.refusal, r.reason);
  return 0;
}
