/* mc.h: managed collisions' ops table and the structs its entries take, shared by the map
 * (mc.c), the CPU reference (mc_cpu.c) and the CUDA backend (kernels/mc.cu), with the
 * arithmetic both must do the same way: the hashes, the scores and the order of a round.
 * Compile without floating-point contraction (-ffp-contract=off; nvcc -fmad=false). */
#ifndef UR_MC_H
#define UR_MC_H

#include <stdint.h>
#include "core/core.h"
#include "core/philox.h"
#include "data/synth.h" /* ur__exp, ur__log: IEEE-exact, the same bits on both backends */
#include "uvmrec.h"

#define UR__MC_EMPTY ((int64_t)-1) /* a free row's id, a free candidate slot's key */
#define UR__MC_ONE ((int64_t)65536) /* counts are fixed point: one lookup is UR__MC_ONE */
/* Decayed counts saturate here (2^62: 2^46 lookups), far beyond any run's, but never wrap. */
#define UR__MC_COUNT_MAX ((int64_t)1 << 62)

/* What the device tells the host per table (int64 words), read lazily after each batch. */
enum {
  UR__MI_CAND,      /* distinct candidates in the map */
  UR__MI_LOOKUPS,   /* ids looked up by updating batches */
  UR__MI_RESIDENT,  /* of them, resident */
  UR__MI_FALLBACK,  /* of them, sent to a fallback row */
  UR__MI_NVALS,     /* the last updating batch's ids of this table */
  UR__MI_SKIPPED,   /* updating batches whose candidates did not fit the map (not counted) */
  UR__MI_COUNT
};

/* One table's map as the backend reads it: pointers into memory where it runs. */
typedef struct ur__mc_table {
  int64_t *ids;            /* [cap] the id on each row, UR__MC_EMPTY when free */
  int64_t *counts;         /* [cap] decayed counts, fixed point */
  int64_t *window;         /* [cap] lookups since the last eviction round (64 bits: one hot id
                            * is looked up billions of times between rounds of a large batch) */
  int64_t *last;           /* [cap] step of the last lookup */
  uint32_t *index;         /* [pmask + 1] open addressing, linear probing: row + 1, 0 free */
  int64_t *ckeys;          /* [qmask + 1] the candidates' map: id, or UR__MC_EMPTY */
  int64_t *ccount;         /* [qmask + 1] their lookups */
  int64_t *clast;          /* [qmask + 1] the step of their last lookup */
  int64_t *info;           /* [UR__MI_COUNT] */
  int32_t *admit;          /* [1] this batch: 1 when its candidates fit the map */
  int64_t cap, fallback, pmask, qmask;
  uint64_t seed;
} ur__mc_table;

/* One batch.  Pointers are in memory the backend reads. */
typedef struct ur__mc_batch {
  const ur__mc_table *tables;    /* [T] */
  const int32_t *feat_table;     /* [F] the table of each feature, or -1 */
  const int64_t *bag_start;      /* [F + 1] each feature's first bag, then the bags */
  const int64_t *values, *offsets;
  const int64_t *inverse;        /* VBE: [F * batch], or NULL */
  int32_t *mult;                 /* VBE: [bags] scratch, the samples reading each bag */
  int64_t *out;                  /* [n] */
  int64_t n, bags, batch, step;  /* batch: the full batch (VBE) */
  int32_t T, F, update;
} ur__mc_batch;

/* A round of one table, synchronous.  rows is host memory of qmask + 1 entries. */
typedef struct ur__mc_round {
  int64_t now;             /* batches counted so far */
  int64_t occupied;        /* rows 0..occupied-1 hold ids; the rest are free */
  int32_t policy, evict;   /* evict 0: a fill round */
  double decay, power;
  void *scratch;           /* of the bytes round_scratch gave, where the backend runs */
  int64_t *rows;           /* out: the rows whose id changed, ascending */
  int64_t admitted, evicted, candidates; /* out */
} ur__mc_round;

/* The ops table, filled by the CPU reference (mc_cpu.c) and the CUDA backend (kernels/mc.cu).
 * mc.c has checked every argument. */
typedef struct ur_mc_ops {
  /* One batch on the stream: for each table its ids this batch, and whether its candidates
   * fit (admit: info[CAND] + those ids <= (qmask + 1) / 2, all or none, so an overfull map
   * never makes the count depend on the order of the lookups); then rows (or the ids of
   * features without a table) into out, and when update: counts, last steps, candidates,
   * info. */
  ur_status (*remap)(void *stream, const struct ur__mc_batch *b);
  /* rows[i] for ids[0..n-1] (resident row or fallback row) and resident[i] (may be NULL);
   * every pointer where the backend runs; on the stream. */
  ur_status (*lookup)(void *stream, const struct ur__mc_table *t, const int64_t *ids, int64_t n,
                      int64_t *rows, int32_t *resident);
  /* Scratch a round of t needs, in bytes (0: none). */
  ur_status (*round_scratch)(const struct ur__mc_table *t, size_t *bytes);
  /* One round (see uvmrec.h): ranks, admits, evicts, decays, rebuilds the index and the
   * candidates' map, sets info[CAND]; returns when done. */
  ur_status (*round)(void *stream, const struct ur__mc_table *t, struct ur__mc_round *r);
  /* Inserts every candidate of from into to (an empty map of more slots), on the stream. */
  ur_status (*rehash)(void *stream, const struct ur__mc_table *from, const struct ur__mc_table *to);
  /* Rebuilds t's index from ids[0..occupied-1] (the map restored), on the stream. */
  ur_status (*reindex)(void *stream, const struct ur__mc_table *t, int64_t occupied);
} ur_mc_ops;

/* The CPU backend's table (mc_cpu.c), the reference. */
UR__HIDDEN extern const ur_mc_ops ur__cpu_mc_ops;

/* ---- the arithmetic both backends share ---- */

UR_HD uint64_t ur__mc_hash(const ur__mc_table *t, int64_t id) {
  return ur__mix64((uint64_t)id ^ t->seed);
}

/* The fallback row of a non-resident id: one of the last `fallback` rows. */
UR_HD int64_t ur__mc_fallback_row(const ur__mc_table *t, int64_t id) {
  uint64_t h = ur__mix64((uint64_t)id ^ t->seed ^ 0x5851F42D4C957F2Dull);
  return t->cap + (int64_t)(h % (uint64_t)t->fallback);
}

/* The row holding id, or -1. */
UR_HD int64_t ur__mc_find(const ur__mc_table *t, int64_t id) {
  uint64_t s = ur__mc_hash(t, id) & (uint64_t)t->pmask;
  for (;;) {
    uint32_t v = t->index[s];
    if (!v) return -1;
    if (t->ids[v - 1] == id) return (int64_t)v - 1;
    s = (s + 1) & (uint64_t)t->pmask;
  }
}

/* The fixed-point count of counts plus window lookups, as a double: each part is exact below
 * 2^53 and their sum rounds once, as the sum in integers would (which could overflow). */
UR_HD double ur__mc_total(int64_t counts, int64_t window) {
  return (double)counts + (double)window * (double)UR__MC_ONE;
}

/* A resident's or a candidate's score (higher is better; >= 0, the maps' values being >= 0):
 * counts fixed point, window plain (a candidate's: its lookups).  lru: the step of the last
 * lookup, ties going to more lookups since the last eviction round (a batch holds many more ids
 * than rows: with the step alone, the ids seen last would tie and be chosen by id).  Exact in a
 * double: steps < 2^32. */
UR_HD double ur__mc_score(int32_t policy, int64_t counts, int64_t window, int64_t last,
                          int64_t now, double power) {
  if (policy == UR_MC_LRU)
    return (double)last * 1048576.0 + (double)(window < 1048575 ? window : 1048575);
  double c = ur__mc_total(counts, window);
  if (policy == UR_MC_LFU) return c;
  int64_t age = now > last ? now - last : 0;
  double d = (double)(1 + age);
  return power == 1.0 ? c / d : c / ur__exp(power * ur__log(d));
}

/* a ranks before b: a higher score, then a lower id. */
UR_HD int ur__mc_better(double sa, int64_t ia, double sb, int64_t ib) {
  return sa > sb || (sa == sb && ia < ib);
}

/* Counts after an eviction round: (counts + window) * decay, rounded down, saturated at
 * UR__MC_COUNT_MAX (decay 1 keeps every lookup of a long run).  An eviction round's admission
 * is (0 + lookups) * decay; a fill's keeps its lookups as its window. */
UR_HD int64_t ur__mc_decayed(int64_t counts, int64_t window, double decay) {
  double x = floor(ur__mc_total(counts, window) * decay);
  return x < (double)UR__MC_COUNT_MAX ? (int64_t)x : UR__MC_COUNT_MAX;
}

/* Scores are >= 0, so their bits order as they do: a radix key. */
UR_HD uint64_t ur__mc_score_key(double s) {
  uint64_t k;
  memcpy(&k, &s, 8);
  return k;
}

#endif
