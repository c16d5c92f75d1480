/* interaction.c: the DLRM dot interaction and feature concat/split: public entry points and
 * the CPU backend's versions (the reference).  Per row, the bottom MLP's output and the T
 * pooled embeddings are T+1 vectors z_0..z_T of d elements; the output is z_0 followed by
 * the dot products z_i . z_j, i > j (i >= j with self-interaction), i-major, as in the public
 * DLRM code, then, when the output is padded to a multiple of 8 columns, zeros (the padding's
 * gradient is ignored).  The CPU computes in exact f32 whatever the flags: TF32 products are
 * the GPU's, measured against this. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dense/dense.h"

typedef struct inter_job {
  const void *dense, *emb, *gout;
  void *out, *gdense, *gemb;
  int T1, d, self;
  ur_dtype dd, ed, od;
  int64_t ocols;
  int failed; /* set when a worker could not get its scratch */
} inter_job;

/* Row r's vectors as floats: z[i * d + k]. */
static void load_z(const inter_job *j, int64_t r, float *z) {
  size_t d = (size_t)j->d, T = (size_t)j->T1 - 1;
  for (size_t k = 0; k < d; k++) z[k] = ur__dense_ld(j->dense, j->dd, (size_t)r * d + k);
  for (size_t k = 0; k < T * d; k++) z[d + k] = ur__dense_ld(j->emb, j->ed, (size_t)r * T * d + k);
}

static void inter_fwd_range(void *ctx, size_t r0, size_t r1) {
  inter_job *j = ctx;
  int T1 = j->T1, d = j->d;
  float *z = malloc((size_t)T1 * (size_t)d * sizeof(float));
  if (!z) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (size_t r = r0; r < r1; r++) {
    load_z(j, (int64_t)r, z);
    size_t o = r * (size_t)j->ocols;
    for (int k = 0; k < d; k++) ur__dense_st(j->out, j->od, o + (size_t)k, z[k]);
    size_t p = o + (size_t)d;
    for (int a = 0; a < T1; a++)
      for (int b = 0; b < a + j->self; b++) {
        const float *za = z + (size_t)a * (size_t)d, *zb = z + (size_t)b * (size_t)d;
        float s = 0.0f;
        for (int k = 0; k < d; k++) s += za[k] * zb[k];
        ur__dense_st(j->out, j->od, p++, s);
      }
    for (; p < o + (size_t)j->ocols; p++) ur__dense_st(j->out, j->od, p, 0.0f);
  }
  free(z);
}

/* d(out)/d(z_i) = sum_j G_ij z_j with G the symmetric matrix of the pairs' gradients (a
 * diagonal pair counts twice: d(z.z)/dz = 2z). */
static void inter_bwd_range(void *ctx, size_t r0, size_t r1) {
  inter_job *j = ctx;
  int T1 = j->T1, d = j->d;
  size_t nz = (size_t)T1 * (size_t)d;
  float *z = malloc((2 * nz + (size_t)T1 * (size_t)T1) * sizeof(float));
  if (!z) {
    __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  float *gz = z + nz, *G = gz + nz;
  for (size_t r = r0; r < r1; r++) {
    load_z(j, (int64_t)r, z);
    memset(G, 0, (size_t)T1 * (size_t)T1 * sizeof(float));
    size_t o = r * (size_t)j->ocols, p = o + (size_t)d;
    for (int a = 0; a < T1; a++)
      for (int b = 0; b < a + j->self; b++) {
        float g = ur__dense_ld(j->gout, j->od, p++);
        if (a == b) G[a * T1 + a] = 2.0f * g;
        else G[a * T1 + b] = G[b * T1 + a] = g;
      }
    for (int a = 0; a < T1; a++)
      for (int k = 0; k < d; k++) {
        float s = 0.0f;
        for (int b = 0; b < T1; b++) s += G[a * T1 + b] * z[(size_t)b * (size_t)d + (size_t)k];
        gz[(size_t)a * (size_t)d + (size_t)k] = s;
      }
    for (int k = 0; k < d; k++)
      ur__dense_st(j->gdense, j->dd, r * (size_t)d + (size_t)k,
                   ur__dense_ld(j->gout, j->od, o + (size_t)k) + gz[k]);
    size_t T = (size_t)T1 - 1;
    for (size_t k = 0; k < T * (size_t)d; k++)
      ur__dense_st(j->gemb, j->ed, r * T * (size_t)d + k, gz[(size_t)d + k]);
  }
  free(z);
}

static ur_status cpu_inter(int fwd, const void *dense, const void *emb, const void *gout,
                           void *out, void *gdense, void *gemb, int64_t rows, int64_t ocols,
                           int32_t tables, int32_t dim, int32_t self, ur_dtype dd, ur_dtype ed,
                           ur_dtype od) {
  inter_job j = {dense, emb, gout, out, gdense, gemb, tables + 1, dim, self ? 1 : 0,
                 dd, ed, od, ocols, 0};
  ur__parallel_for((size_t)rows, 64, fwd ? inter_fwd_range : inter_bwd_range, &j);
  if (j.failed)
    return ur__error(UR_STATUS_OOM, "interaction %s: out of host memory for a row's scratch",
                     fwd ? "forward" : "backward");
  return UR_STATUS_OK;
}

ur_status ur__cpu_interaction_forward(void *stream, const void *dense, const void *emb,
                                      void *out, int64_t rows, int64_t ocols, int32_t tables,
                                      int32_t dim, int32_t self, ur_dtype dense_dtype,
                                      ur_dtype emb_dtype, ur_dtype out_dtype, uint32_t flags) {
  (void)stream;
  (void)flags;
  return cpu_inter(1, dense, emb, NULL, out, NULL, NULL, rows, ocols, tables, dim, self,
                   dense_dtype, emb_dtype, out_dtype);
}

ur_status ur__cpu_interaction_backward(void *stream, const void *dense, const void *emb,
                                       const void *gout, void *gdense, void *gemb, int64_t rows,
                                       int64_t ocols, int32_t tables, int32_t dim, int32_t self,
                                       ur_dtype dense_dtype, ur_dtype emb_dtype,
                                       ur_dtype out_dtype, uint32_t flags) {
  (void)stream;
  (void)flags;
  return cpu_inter(0, dense, emb, gout, NULL, gdense, gemb, rows, ocols, tables, dim, self,
                   dense_dtype, emb_dtype, out_dtype);
}

/* Shapes of an interaction: dense [rows, d], emb [rows, T d], out [rows, d + P] or padded
 * to [rows, ur_interaction_cols(T, d, self, 1)]. */
static ur_status inter_shapes(const char *op, const ur_tensor *dense, const ur_tensor *emb,
                              const ur_tensor *out, const char *out_name, int32_t self,
                              uint32_t flags, int32_t *tables) {
  ur_status st = ur__dense_check(op, "dense", dense, 1, -1, -1);
  if (st) return st;
  int64_t rows = dense->shape[0], d = dense->shape[1];
  if (d < 1 || d > INT_MAX)
    return ur__error(UR_STATUS_INVALID, "%s: dense has %lld columns; expected 1 to %d", op,
                     (long long)d, INT_MAX);
  if ((st = ur__dense_check(op, "emb", emb, 1, rows, -1))) return st;
  int64_t T = emb->shape[1] / d;
  if (emb->shape[1] % d || T < 1 || T >= 65536)
    return ur__error(UR_STATUS_INVALID,
                     "%s: emb has %lld columns; expected T * %lld (T tables of dense's width "
                     "%lld, 1 <= T < 65536)",
                     op, (long long)emb->shape[1], (long long)d, (long long)d);
  if (self != 0 && self != 1)
    return ur__error(UR_STATUS_INVALID, "%s: self_interaction is %d; expected 0 or 1", op,
                     (int)self);
  if (flags & ~(uint32_t)UR_DENSE_TF32)
    return ur__error(UR_STATUS_INVALID, "%s: flags 0x%x include bits other than TF32 (0x%x)", op,
                     (unsigned)flags, (unsigned)UR_DENSE_TF32);
  *tables = (int32_t)T;
  int64_t w = d + ur__inter_pairs(T + 1, self), wp = (w + 7) / 8 * 8;
  if (out && out->ndim == 2 && out->shape[1] == wp) return ur__dense_check(op, out_name, out, 1, rows, wp);
  st = ur__dense_check(op, out_name, out, 1, rows, w);
  if (!st || w == wp) return st;
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ur_last_error());
  return ur__error(st, "%s (or %lld columns: padded to a multiple of 8)", msg, (long long)wp);
}

int64_t ur_interaction_cols(int32_t tables, int32_t dim, int32_t self_interaction,
                            int32_t padded) {
  if (tables < 1 || dim < 1) return 0;
  int64_t w = dim + ur__inter_pairs((int64_t)tables + 1, self_interaction != 0);
  return padded ? (w + 7) / 8 * 8 : w;
}

ur_status ur_interaction_forward(ur_stream *s, const ur_tensor *dense, const ur_tensor *emb,
                                 ur_tensor *out, int32_t self_interaction, uint32_t flags) {
  UR__ARGS(dense, emb, out);
  const char *op = "interaction forward";
  int32_t T;
  ur_status st = inter_shapes(op, dense, emb, out, "out", self_interaction, flags, &T);
  if (st) return st;
  const ur_tensor *ts[] = {dense, emb, out};
  const char *names[] = {"dense", "emb", "out"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 3, ts, names, &b)) ||
      (st = UR__NEED(b, dense, interaction_forward)) || !dense->shape[0])
    return st;
  return b->dense->interaction_forward(ur__dense_stream(s), ur_tensor_data(dense),
                                       ur_tensor_data(emb), ur_tensor_data(out), dense->shape[0],
                                       out->shape[1], T, (int32_t)dense->shape[1],
                                       self_interaction, dense->dtype, emb->dtype, out->dtype,
                                       flags);
}

ur_status ur_interaction_backward(ur_stream *s, const ur_tensor *dense, const ur_tensor *emb,
                                  const ur_tensor *gout, ur_tensor *gdense, ur_tensor *gemb,
                                  int32_t self_interaction, uint32_t flags) {
  UR__ARGS(dense, emb, gout, gdense, gemb);
  const char *op = "interaction backward";
  int32_t T;
  ur_status st = inter_shapes(op, dense, emb, gout, "gout", self_interaction, flags, &T);
  if (st) return st;
  if ((st = ur__dense_check(op, "gdense", gdense, 1, dense->shape[0], dense->shape[1])) ||
      (st = ur__dense_check(op, "gemb", gemb, 1, emb->shape[0], emb->shape[1])))
    return st;
  if (gdense->dtype != dense->dtype || gemb->dtype != emb->dtype)
    return ur__error(UR_STATUS_INVALID,
                     "%s: gdense is %s and gemb %s but dense is %s and emb %s; each gradient "
                     "takes its input's dtype",
                     op, ur_dtype_name(gdense->dtype), ur_dtype_name(gemb->dtype),
                     ur_dtype_name(dense->dtype), ur_dtype_name(emb->dtype));
  const ur_tensor *ts[] = {dense, emb, gout, gdense, gemb};
  const char *names[] = {"dense", "emb", "gout", "gdense", "gemb"};
  const ur_backend *b;
  if ((st = ur__dense_backend(op, 5, ts, names, &b)) ||
      (st = UR__NEED(b, dense, interaction_backward)) || !dense->shape[0])
    return st;
  return b->dense->interaction_backward(ur__dense_stream(s), ur_tensor_data(dense),
                                        ur_tensor_data(emb), ur_tensor_data(gout),
                                        ur_tensor_data(gdense), ur_tensor_data(gemb),
                                        dense->shape[0], gout->shape[1], T,
                                        (int32_t)dense->shape[1], self_interaction, dense->dtype,
                                        emb->dtype, gout->dtype, flags);
}

/* ---- concat / split ---- */

ur_status ur__cpu_copy_2d(void *stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t rows) {
  (void)stream;
  for (size_t r = 0; r < rows; r++)
    memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return UR_STATUS_OK;
}

/* Checks parts against whole and copies each way (to_whole: concat). */
static ur_status concat_split(const char *op, ur_stream *s, const ur_tensor *const *parts,
                              int32_t n, const ur_tensor *whole, const char *whole_name,
                              int to_whole) {
  if (n < 1 || n > 4096)
    return ur__error(UR_STATUS_INVALID, "%s: %d parts; expected 1 to 4096", op, (int)n);
  ur_status st = ur__dense_check(op, whole_name, whole, 1, -1, -1);
  if (st) return st;
  int64_t rows = whole->shape[0], total = 0;
  char name[32];
  for (int32_t i = 0; i < n; i++) {
    snprintf(name, sizeof name, "part %d", (int)i + 1);
    if ((st = ur__dense_check(op, name, parts[i], 1, rows, -1))) return st;
    if (parts[i]->dtype != whole->dtype)
      return ur__error(UR_STATUS_INVALID, "%s: %s is %s but %s is %s; all take one dtype", op,
                       name, ur_dtype_name(parts[i]->dtype), whole_name,
                       ur_dtype_name(whole->dtype));
    total += parts[i]->shape[1];
  }
  if (total != whole->shape[1])
    return ur__error(UR_STATUS_INVALID, "%s: the parts have %lld columns together but %s has %lld",
                     op, (long long)total, whole_name, (long long)whole->shape[1]);
  const ur_backend *b = NULL;
  for (int32_t i = 0; i < n; i++) {
    const ur_tensor *ts[] = {whole, parts[i]};
    const char *names[] = {whole_name, "a part"};
    const ur_backend *bi;
    if ((st = ur__dense_backend(op, 2, ts, names, &bi))) return st;
    if (b && bi != b)
      return ur__error(UR_STATUS_INVALID, "%s: the parts are not all on %s's side (GPU or host)",
                       op, whole_name);
    b = bi;
  }
  if ((st = UR__NEED(b, dense, copy_2d))) return st;
  size_t es = ur_dtype_size(whole->dtype), pitch = (size_t)whole->shape[1] * es, col = 0;
  for (int32_t i = 0; i < n; i++) {
    size_t w = (size_t)parts[i]->shape[1] * es;
    char *wp = (char *)ur_tensor_data(whole) + col;
    char *pp = ur_tensor_data(parts[i]);
    if (w && rows) {
      st = to_whole ? b->dense->copy_2d(ur__dense_stream(s), wp, pitch, pp, w, w, (size_t)rows)
                    : b->dense->copy_2d(ur__dense_stream(s), pp, w, wp, pitch, w, (size_t)rows);
      if (st) return st;
    }
    col += w;
  }
  return UR_STATUS_OK;
}

ur_status ur_features_concat(ur_stream *s, const ur_tensor *const *parts, int32_t n,
                             ur_tensor *out) {
  UR__ARGS(parts, out);
  return concat_split("features concat", s, parts, n, out, "out", 1);
}

ur_status ur_features_split(ur_stream *s, const ur_tensor *in, ur_tensor *const *parts,
                            int32_t n) {
  UR__ARGS(in, parts);
  return concat_split("features split", s, (const ur_tensor *const *)parts, n, in, "in", 0);
}
