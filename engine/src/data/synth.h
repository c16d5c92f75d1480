/* synth.h: one synthetic sample, shared by the CPU generator (synth_cpu.c) and the GPU one
 * (kernels/synth.cu), and the generator's ops table they fill.  Every number comes from
 * Philox at a counter made of the sample index and a slot, and the only math is IEEE-exact
 * (+, -, *, /, floor) or built from it (the exp and log below), so both give bit-identical
 * samples for a seed.  Compile without floating-point contraction (-ffp-contract=off, nvcc
 * -fmad=false). */
#ifndef UR_SYNTH_H
#define UR_SYNTH_H

#include <stdint.h>
#include <string.h>
#include "core/core.h"
#include "core/philox.h"

/* A table of the spec, expanded: Zipf constants, the id scatter, the column of its ids. */
typedef struct ur__synth_tab {
  int64_t rows, col0;             /* rows: the id space (the spec's id_space, else its rows) */
  double s, hx1, hn, sv;          /* rejection-inversion Zipf (Hoermann & Derflinger) */
  uint64_t pa, pb;                /* id = (rank * pa + pb) mod rows: hot ids scattered */
  int32_t hot_min, hot_max, weighted, zipf;
  double signal;
} ur__synth_tab;

typedef struct ur__synth {
  int32_t T, D;
  int64_t H;                      /* id columns: sum of hot_max */
  uint64_t seed;
  double dense_signal, bias;
  int64_t groups;
  double drift;                   /* ranks the hot set advances a sample (ur_synth_spec's) */
  double dw[64];                  /* the hidden dense weights of the first 64 features */
  ur__synth_tab *t;               /* T of them: host memory (the GPU generator copies them) */
} ur__synth;

/* Streams: each purpose draws with its own key. */
enum { UR__S_DENSE = 1, UR__S_DW, UR__S_LEN, UR__S_ID, UR__S_W, UR__S_LABEL, UR__S_GROUP, UR__S_EFF };

UR_HD uint64_t ur__skey(uint64_t seed, uint64_t purpose, uint64_t table) {
  uint64_t k = seed ^ (purpose * 0x9E3779B97F4A7C15ull) ^ (table * 0xC2B2AE3D27D4EB4Full);
  k ^= k >> 29;
  k *= 0xBF58476D1CE4E5B9ull;
  return k ^ (k >> 32);
}

/* A uniform in (0, 1) with 53 bits. */
UR_HD double ur__u53(ur_philox4 r) {
  uint64_t x = ((uint64_t)r.v[0] << 21) ^ ((uint64_t)r.v[1] >> 11);
  x &= (1ull << 53) - 1;
  return ((double)x + 0.5) * (1.0 / 9007199254740992.0);
}

/* Sum of four uniforms scaled to unit variance: a normal-like draw with no libm. */
UR_HD double ur__unorm(ur_philox4 r) {
  double s = 0;
  for (int i = 0; i < 4; i++) s += (double)((r.v[i] >> 8) + 1u) * (1.0 / 16777216.0);
  return (s - 2.0) * 1.7320508075688772;
}

UR_HD double ur__ldexp_int(int k) { /* 2^k for -1022 <= k <= 1023 */
  uint64_t bits = (uint64_t)(k + 1023) << 52;
  double d;
  memcpy(&d, &bits, 8);
  return d;
}

UR_HD double ur__exp(double x) {
  if (x > 700.0) x = 700.0;
  if (x < -700.0) return 0.0;
  double kf = floor(x * 1.4426950408889634 + 0.5);
  double r = (x - kf * 0.6931471803691238) - kf * 1.9082149292705877e-10;
  /* Taylor to r^13 (|r| <= 0.35), Horner with the constants 1/i!. */
  double p = 1.6059043836821613e-10;
  p = p * r + 2.08767569878681e-09;
  p = p * r + 2.505210838544172e-08;
  p = p * r + 2.755731922398589e-07;
  p = p * r + 2.7557319223985893e-06;
  p = p * r + 2.48015873015873e-05;
  p = p * r + 1.984126984126984e-04;
  p = p * r + 1.388888888888889e-03;
  p = p * r + 8.333333333333333e-03;
  p = p * r + 4.1666666666666664e-02;
  p = p * r + 1.6666666666666666e-01;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return p * ur__ldexp_int((int)kf);
}

UR_HD double ur__log(double x) { /* x > 0, normal */
  uint64_t bits;
  memcpy(&bits, &x, 8);
  int e = (int)((bits >> 52) & 0x7ff) - 1023;
  bits = (bits & ((1ull << 52) - 1)) | (1023ull << 52);
  double m;
  memcpy(&m, &bits, 8); /* [1, 2) */
  if (m > 1.4142135623730951) {
    m *= 0.5;
    e += 1;
  }
  /* 2 atanh(f) = 2 (f + f^3/3 + ... + f^25/25), |f| <= 0.172, Horner in f^2. */
  double f = (m - 1.0) / (m + 1.0), f2 = f * f;
  double p = 1.0 / 25;
  p = p * f2 + 1.0 / 23;
  p = p * f2 + 1.0 / 21;
  p = p * f2 + 1.0 / 19;
  p = p * f2 + 1.0 / 17;
  p = p * f2 + 1.0 / 15;
  p = p * f2 + 1.0 / 13;
  p = p * f2 + 1.0 / 11;
  p = p * f2 + 1.0 / 9;
  p = p * f2 + 1.0 / 7;
  p = p * f2 + 1.0 / 5;
  p = p * f2 + 1.0 / 3;
  p = p * f2 + 1.0;
  double sum = f * p;
  return (double)e * 0.6931471803691238 + (double)e * 1.9082149292705877e-10 + 2.0 * sum;
}

/* log1p(x)/x and expm1(x)/x, with series near 0. */
UR_HD double ur__helper1(double x) {
  if (x > 1e-4 || x < -1e-4) return ur__log(1.0 + x) / x;
  return 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}
UR_HD double ur__helper2(double x) {
  if (x > 1e-4 || x < -1e-4) return (ur__exp(x) - 1.0) / x;
  return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}
UR_HD double ur__zh(double s, double x) { return ur__exp(-s * ur__log(x)); }
UR_HD double ur__zH(double s, double x) {
  double lx = ur__log(x);
  return ur__helper2((1.0 - s) * lx) * lx;
}
UR_HD double ur__zHinv(double s, double x) {
  double t = x * (1.0 - s);
  if (t < -1.0) t = -1.0;
  return ur__exp(ur__helper1(t) * x);
}

/* A rank in [1, rows] for ctr = sample * 4096 + slot.  A Zipf table's tries a = 0, 1, ... take
 * counter (ctr mod 2^40) + a * 2^40 with ctr / 2^40 (the sample / 2^28) as the counter's high
 * word: in 64 bits, sample i + 2^28's first try was sample i's second, and so on, a stream of
 * tries shared past 268 M samples (a day and a half of Criteo).  A uniform table's one draw
 * is at ctr. */
UR_HD int64_t ur__zipf(const ur__synth_tab *t, uint64_t ctr, uint64_t key) {
  const uint64_t low40 = (1ull << 40) - 1;
  uint64_t lo = t->zipf ? ctr & low40 : ctr, hi = t->zipf ? ctr >> 40 : 0;
  for (uint64_t a = 0; a < 64; a++) {
    double u01 = ur__u53(ur_philox128(lo + (a << 40), hi, key));
    if (!t->zipf) {
      int64_t k = (int64_t)floor(u01 * (double)t->rows) + 1;
      return k > t->rows ? t->rows : k;
    }
    double u = t->hn + u01 * (t->hx1 - t->hn);
    double x = ur__zHinv(t->s, u);
    int64_t k = (int64_t)floor(x + 0.5);
    if (k < 1) k = 1;
    else if (k > t->rows) k = t->rows;
    if ((double)k - x <= t->sv || u >= ur__zH(t->s, (double)k + 0.5) - ur__zh(t->s, (double)k))
      return k;
  }
  return 1; /* not reached in practice: acceptance is above 1/2 per draw */
}

/* One sample.  dense [D], ids/weights [H] (unused slots -1 and 0), lengths [T]. */
UR_HD void ur__synth_row(const ur__synth *sp, int64_t i, float *dense, float *label,
                         int64_t *ids, float *w, int32_t *len, int64_t *group, float *prob) {
  uint64_t base = (uint64_t)i << 12;
  double logit = sp->bias, dl = 0;
  uint64_t kd = ur__skey(sp->seed, UR__S_DENSE, 0);
  for (int j = 0; j < sp->D; j++) {
    double u = ur__u53(ur_philox(base + (uint64_t)j, kd));
    double d = -ur__log(u); /* exponential(1): nonnegative like log-transformed counts */
    dense[j] = (float)d;
    double wj = j < 64 ? sp->dw[j] : ur__unorm(ur_philox((uint64_t)j, ur__skey(sp->seed, UR__S_DW, 0)));
    dl += wj * ((double)(float)d - 1.0);
  }
  logit += sp->dense_signal * dl;
  for (int t = 0; t < sp->T; t++) {
    const ur__synth_tab *tb = &sp->t[t];
    int32_t n = tb->hot_max;
    if (tb->hot_min != tb->hot_max) {
      /* table t at slot t mod 4096 of the sample's counters, t / 4096 the high word: slot t of
       * sample i was slot t - 4096 of sample i + 1 past 4096 tables */
      ur_philox4 r = ur_philox128(base + ((uint64_t)t & 4095), (uint64_t)t >> 12,
                                  ur__skey(sp->seed, UR__S_LEN, 0));
      n = tb->hot_min + (int32_t)(r.v[0] % (uint32_t)(tb->hot_max - tb->hot_min + 1));
    }
    len[t] = n;
    double eff = 0, wsum = 0;
    uint64_t kid = ur__skey(sp->seed, UR__S_ID, (uint64_t)t);
    uint64_t keff = ur__skey(sp->seed, UR__S_EFF, (uint64_t)t);
    for (int32_t j = 0; j < tb->hot_max; j++) {
      int64_t col = tb->col0 + j;
      if (j >= n) {
        ids[col] = -1;
        if (w) w[col] = 0;
        continue;
      }
      int64_t rank = ur__zipf(tb, base + (uint64_t)j, kid);
      if (sp->drift > 0) /* a drifting hot set: rank r of sample i is rank r + floor(i drift) */
        rank = (int64_t)(((uint64_t)(rank - 1) + (uint64_t)floor((double)i * sp->drift)) %
                         (uint64_t)tb->rows) + 1;
      int64_t id = (int64_t)(((uint64_t)(rank - 1) * tb->pa + tb->pb) % (uint64_t)tb->rows);
      ids[col] = id;
      double wt = 1.0;
      if (tb->weighted) {
        ur_philox4 r = ur_philox(base + (uint64_t)j, ur__skey(sp->seed, UR__S_W, (uint64_t)t));
        wt = (double)ur_u01(r.v[0]);
      }
      if (w) w[col] = (float)wt;
      eff += wt * ur__unorm(ur_philox((uint64_t)id, keff));
      wsum += wt;
    }
    if (wsum > 0) logit += tb->signal * eff / wsum;
  }
  double p = 1.0 / (1.0 + ur__exp(-logit));
  double u = ur__u53(ur_philox(base, ur__skey(sp->seed, UR__S_LABEL, 0)));
  *label = u < p ? 1.0f : 0.0f;
  if (prob) *prob = (float)p;
  if (group) {
    if (sp->groups > 0) {
      double g = ur__u53(ur_philox(base, ur__skey(sp->seed, UR__S_GROUP, 0)));
      int64_t k = (int64_t)floor(g * (double)sp->groups);
      *group = k >= sp->groups ? sp->groups - 1 : k;
    } else {
      *group = 0;
    }
  }
}

/* The spec checked and expanded (synth.c): the Zipf constants, the scatter, the columns.
 * On failure nothing is left to release. */
UR__HIDDEN ur_status ur__synth_expand(const ur_synth_spec *s, ur__synth *x);
/* Frees what expand allocated (the tables); x itself is the caller's. */
UR__HIDDEN void ur__synth_release(ur__synth *x);

/* The generator's ops table; synth.c has checked the outputs (memory the backend reads,
 * sizes).  Samples first..first + n - 1, laid out as ur__synth_row's. */
typedef struct ur_synth_ops {
  ur_status (*generate)(void *stream, const struct ur__synth *x, int64_t first, int64_t n,
                        void *dense, void *labels, void *ids, void *weights, void *lengths,
                        void *groups, void *probs);
} ur_synth_ops;

/* The CPU reference (synth_cpu.c); the CUDA backend's is ur__cuda_synth_ops
 * (kernels/synth.cu). */
UR__HIDDEN extern const ur_synth_ops ur__cpu_synth_ops;

#endif
