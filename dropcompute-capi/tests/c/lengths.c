/* A length-aware C training loop: a `length-predictive` policy with declared bucket lengths, a
 * per-bucket estimator kept across steps, and each step's micro-batches told to the walk with
 * their buckets and tokens (dc_walk_set_micro_batches). Reads the script on stdin:
 *   THRESHOLD_NS M STEPS NB LEN_0 .. LEN_NB-1
 *   then per step: M buckets, M tokens, M latencies (ns)
 * and prints, per step, the micro-batches launched, whether the deadline stopped the step and
 * the tokens started (dc_walk_tokens_started), then each bucket's estimate and the tokens
 * divisor of the steps' counts (dc_divisor_weighted), for tests/c_program.rs to compare with
 * the Rust walker. Exit 0 = every check passed. */
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

#define MAX_M 64
#define MAX_STEPS 64

int main(void) {
  long long threshold = 0;
  unsigned m = 0, steps = 0, nb = 0;
  uint32_t lens[16];
  CHECK(scanf("%lld %u %u %u", &threshold, &m, &steps, &nb) == 4);
  CHECK(m <= MAX_M && steps <= MAX_STEPS && nb <= 16);
  for (unsigned b = 0; b < nb; b++) CHECK(scanf("%u", &lens[b]) == 1);
  DcPolicy *p = NULL;
  CHECK(dc_policy_new_kind("length-predictive", threshold, 0, 1, lens, nb, &p) == DC_OK && p != NULL);
  /* An unknown kind and a bucket beyond the declared lengths are refused with their value. */
  DcPolicy *bad = (DcPolicy *)1;
  CHECK(dc_policy_new_kind("length-blind", threshold, 0, 1, lens, nb, &bad) == DC_INVALID_ARGUMENT && bad == NULL);
  CHECK(strstr(dc_last_error(), "kind \"length-blind\"") != NULL);
  DcEstimator *e = NULL;
  CHECK(dc_estimator_new(32, 0.9, &e) == DC_OK);
  uint64_t counts[MAX_STEPS];
  for (unsigned s = 0; s < steps; s++) {
    uint32_t buckets[MAX_M];
    uint64_t tokens[MAX_M], lat[MAX_M], ends[MAX_M];
    for (unsigned j = 0; j < m; j++) CHECK(scanf("%u", &buckets[j]) == 1);
    for (unsigned j = 0; j < m; j++) CHECK(scanf("%llu", (unsigned long long *)&tokens[j]) == 1);
    for (unsigned j = 0; j < m; j++) CHECK(scanf("%llu", (unsigned long long *)&lat[j]) == 1);
    DcWalk *w = NULL;
    CHECK(dc_walk_new(p, s, m, 0, &w) == DC_OK);
    uint32_t wrong[MAX_M];
    memcpy(wrong, buckets, sizeof(uint32_t) * m);
    wrong[m - 1] = nb;
    CHECK(dc_walk_set_micro_batches(w, wrong, tokens, m) == DC_INVALID_ARGUMENT);
    CHECK(strstr(dc_last_error(), "must be a bucket index below") != NULL);
    CHECK(dc_walk_set_micro_batches(w, buckets, tokens, m - 1) == DC_INVALID_ARGUMENT);
    CHECK(dc_walk_set_micro_batches(w, buckets, tokens, m) == DC_OK);
    uint64_t launched[MAX_M], n = 0, value = 0;
    uint32_t kind = 0;
    printf("step=%u launched=", s);
    for (;;) {
      CHECK(dc_walk_next(w, e, &kind, &value) == DC_OK);
      if (kind == DC_WALK_DONE) break;
      if (kind == DC_WALK_LAUNCH) {
        CHECK(value < m);
        launched[n] = value;
        ends[n] = (n ? ends[n - 1] : 0) + lat[value];
        printf("%s%llu", n ? "," : "", (unsigned long long)value);
        n++;
        continue;
      }
      for (uint64_t i = dc_walk_reported(w); i < value; i++)
        CHECK(dc_walk_ended(w, e, i, ends[i], lat[launched[i]]) == DC_OK);
    }
    CHECK(dc_walk_set_micro_batches(w, buckets, tokens, m) == DC_INVALID_ARGUMENT); /* launched */
    CHECK(dc_walk_tokens_started(w, &counts[s]) == DC_OK);
    printf(" stopped=%llu tokens=%llu\n", (unsigned long long)value, (unsigned long long)counts[s]);
    dc_walk_free(w);
  }
  for (unsigned b = 0; b < nb; b++) {
    uint64_t est = 0;
    CHECK(dc_estimator_estimate(e, b, &est) == DC_OK);
    printf("estimate bucket=%u ns=%llu\n", b, (unsigned long long)est);
  }
  double d = 0;
  CHECK(dc_divisor_weighted(counts, steps, DC_NORMALIZATION_REALIZED, DC_WEIGHTING_TOKENS, m, 1, &d) == DC_OK);
  printf("divisor=%.1f\n", d);
  dc_estimator_free(e);
  dc_policy_free(p);
  return 0;
}
