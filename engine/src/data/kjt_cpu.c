/* kjt_cpu.c: the CPU's keyed-jagged-tensor table, the reference kernels/kjt.cu equals: the
 * same entries (data/kjt.h) on host memory, one thread, in bag order.  Nothing here waits:
 * the CPU's work is done when an entry returns. */
#include <stdlib.h>
#include <string.h>
#include "data/kjt.h"

static ur_status cpu_offsets(void *stream, const int32_t *len, int64_t nb, int64_t *off,
                             const int64_t *bag0, int32_t nkeys, int64_t nv, int64_t *val0,
                             int64_t *bad) {
  (void)stream;
  int64_t sum = 0, neg = -1, over = -1;
  off[0] = 0;
  for (int64_t b = 0; b < nb; b++) {
    if (len[b] < 0 && neg < 0) neg = b;
    sum += len[b];
    off[b + 1] = sum;
    if (sum > nv && over < 0) over = b;
  }
  if (!val0) return UR_STATUS_OK;
  for (int32_t i = 0; i <= nkeys; i++) val0[i] = off[bag0[i]];
  bad[0] = neg;
  bad[1] = over;
  return UR_STATUS_OK;
}

static ur_status cpu_validate(void *stream, const int32_t *len, const int64_t *off,
                              const int64_t *val, const int64_t *inv, int64_t nv, int32_t nkeys,
                              int64_t stride, const int64_t *bag0, const int64_t *spk,
                              const int64_t *rows, int64_t *bad) {
  (void)stream;
  bad[0] = bad[1] = bad[2] = -1;
  for (int32_t key = 0; key < nkeys; key++) {
    int64_t r = rows ? rows[key] : 0;
    for (int64_t b = bag0[key]; b < bag0[key + 1]; b++) {
      int64_t o0 = off[b], o1 = off[b + 1];
      if (!ur__kjt_bag_sound(len[b], o0, o1, nv)) {
        if (bad[0] < 0) bad[0] = b;
        continue;
      }
      /* Only a sound bag's ids can be read: its offsets lie within the values. */
      if (r <= 0 || bad[1] >= 0) continue;
      for (int64_t v = o0; v < o1; v++)
        if (val[v] < 0 || val[v] >= r) {
          bad[1] = b;
          break;
        }
    }
  }
  if (inv)
    for (int64_t i = 0; i < (int64_t)nkeys * stride; i++)
      if (inv[i] < 0 || inv[i] >= spk[i / stride]) {
        bad[2] = i;
        break;
      }
  return UR_STATUS_OK;
}

static ur_status cpu_segments(void *stream, void *dst, size_t elem_bytes,
                              const ur__kjt_seg *segs, int64_t nseg) {
  (void)stream;
  for (int64_t i = 0; i < nseg; i++)
    if (segs[i].n > 0)
      memcpy((char *)dst + (size_t)segs[i].dst * elem_bytes, segs[i].src,
             (size_t)segs[i].n * elem_bytes);
  return UR_STATUS_OK;
}

static ur_status cpu_expand_map(void *stream, const int64_t *inv, const int64_t *bag0,
                                int32_t nkeys, int64_t stride, int64_t *map) {
  (void)stream;
  for (int32_t k = 0; k < nkeys; k++)
    for (int64_t j = 0; j < stride; j++) {
      int64_t i = k * stride + j;
      map[i] = bag0[k] + (inv ? inv[i] : j);
    }
  return UR_STATUS_OK;
}

static ur_status cpu_bag_lengths(void *stream, const int32_t *len, const int64_t *map, int64_t n,
                                 int32_t *len_out, int64_t *off_out, int64_t step, int32_t nat,
                                 int64_t *at) {
  (void)stream;
  off_out[0] = 0;
  for (int64_t i = 0; i < n; i++) {
    len_out[i] = len[map[i]];
    off_out[i + 1] = off_out[i] + len_out[i];
  }
  for (int32_t j = 0; j < nat; j++) at[j] = off_out[j * step];
  return UR_STATUS_OK;
}

static ur_status cpu_bag_copy(void *stream, const int64_t *off, const int64_t *val, const float *w,
                              const int64_t *map, int64_t n, const int64_t *off_out,
                              int64_t *val_out, float *w_out) {
  (void)stream;
  for (int64_t i = 0; i < n; i++) {
    int64_t b = map[i], m = off[b + 1] - off[b];
    if (m <= 0) continue;
    memcpy(val_out + off_out[i], val + off[b], sizeof(int64_t) * (size_t)m);
    if (w) memcpy(w_out + off_out[i], w + off[b], sizeof(float) * (size_t)m);
  }
  return UR_STATUS_OK;
}

static ur_status cpu_expand_rows(void *stream, const void *src, size_t row_bytes,
                                 const int64_t *inv, const int64_t *bag0, int32_t nkeys,
                                 int64_t stride, void *dst) {
  (void)stream;
  for (int32_t k = 0; k < nkeys; k++)
    for (int64_t j = 0; j < stride; j++) {
      int64_t i = k * stride + j, from = bag0[k] + (inv ? inv[i] : j);
      memcpy((char *)dst + (size_t)i * row_bytes, (const char *)src + (size_t)from * row_bytes,
             row_bytes);
    }
  return UR_STATUS_OK;
}

/* ---- dedup ---- */

static int bag_equal(const int64_t *off, const int64_t *val, const float *w, int64_t a,
                     int64_t b) {
  int64_t na = off[a + 1] - off[a];
  if (na != off[b + 1] - off[b]) return 0;
  if (memcmp(val + off[a], val + off[b], sizeof(int64_t) * (size_t)na)) return 0;
  return !w || !memcmp(w + off[a], w + off[b], sizeof(float) * (size_t)na);
}

/* One open-addressing table per key, sized for the key's bags: a bag's first appearance takes
 * the next distinct number, a later equal bag finds it. */
static ur_status cpu_dedup(void *stream, const int64_t *off, const int64_t *val, const float *w,
                           const int32_t *len, int32_t nkeys, int64_t stride, int64_t *map,
                           int64_t *inv, int64_t *spk, int64_t *val0) {
  (void)stream;
  size_t cap = 16;
  while (cap < (size_t)stride * 2) cap <<= 1;
  int64_t *table = malloc(sizeof(int64_t) * cap);
  if (!table) return ur__error(UR_STATUS_OOM, "kjt dedup: out of host memory");
  int64_t nu = 0, vo = 0;
  for (int32_t key = 0; key < nkeys; key++) {
    for (size_t i = 0; i < cap; i++) table[i] = -1;
    int64_t u0 = nu;
    val0[key] = vo;
    for (int64_t s = 0; s < stride; s++) {
      int64_t bag = key * stride + s;
      uint64_t hv =
          ur__kjt_bag_hash(val + off[bag], w ? w + off[bag] : NULL, off[bag + 1] - off[bag]);
      size_t slot = (size_t)hv & (cap - 1);
      int64_t found = -1;
      while (table[slot] >= 0) {
        if (bag_equal(off, val, w, map[table[slot]], bag)) {
          found = table[slot];
          break;
        }
        slot = (slot + 1) & (cap - 1);
      }
      if (found < 0) {
        found = nu;
        map[nu++] = bag;
        table[slot] = found;
        vo += len[bag];
      }
      inv[bag] = found - u0;
    }
    spk[key] = nu - u0;
  }
  val0[nkeys] = vo;
  free(table);
  return UR_STATUS_OK;
}

static ur_status cpu_from_rows(void *stream, const int64_t *ids, const float *w,
                               const int32_t *len, int64_t n, int32_t nkeys, int64_t H,
                               const int64_t *col0, const int32_t *hot, int32_t *len_out,
                               int64_t *off_out, int64_t *val_out, float *w_out, int64_t *val0,
                               int64_t *bad) {
  (void)stream;
  int64_t sum = 0;
  off_out[0] = 0;
  if (bad) *bad = -1;
  for (int32_t k = 0; k < nkeys; k++) {
    if (val0) val0[k] = sum;
    for (int64_t i = 0; i < n; i++) {
      int64_t b = k * n + i;
      int32_t l = len ? len[i * nkeys + k] : hot[k];
      if (l < 0 || l > hot[k]) {
        if (bad && *bad < 0) *bad = b;
        l = 0;
      }
      len_out[b] = l;
      const int64_t *src = ids + i * H + col0[k];
      for (int32_t q = 0; q < l; q++) {
        val_out[sum + q] = src[q];
        if (w_out) w_out[sum + q] = w[i * H + col0[k] + q];
      }
      sum += l;
      off_out[b + 1] = sum;
    }
  }
  if (val0) val0[nkeys] = sum;
  return UR_STATUS_OK;
}

static ur_status cpu_bucket_count(void *stream, const int64_t *off, const int64_t *val,
                                  int64_t nb, int64_t block, int64_t rows, int32_t buckets,
                                  int32_t *cnt, int64_t *bad) {
  (void)stream;
  *bad = -1;
  memset(cnt, 0, sizeof *cnt * (size_t)nb * (size_t)buckets);
  for (int64_t j = 0; j < nb; j++)
    for (int64_t v = off[j]; v < off[j + 1]; v++) {
      if (val[v] < 0 || val[v] >= rows) {
        if (*bad < 0) *bad = v;
        continue;
      }
      cnt[(val[v] / block) * nb + j]++;
    }
  return UR_STATUS_OK;
}

static ur_status cpu_bucket_fill(void *stream, const int64_t *off, const int64_t *val,
                                 const float *w, int64_t nb, int64_t block, int32_t buckets,
                                 const int64_t *off_out, int64_t *val_out, float *w_out) {
  (void)stream;
  for (int64_t j = 0; j < nb; j++)
    for (int32_t b = 0, k = 0; b < buckets; b++, k = 0)
      for (int64_t v = off[j]; v < off[j + 1]; v++)
        if (val[v] / block == b) {
          int64_t d = off_out[(int64_t)b * nb + j] + k++;
          val_out[d] = val[v] - (int64_t)b * block;
          if (w) w_out[d] = w[v];
        }
  return UR_STATUS_OK;
}

const ur_kjt_ops ur__cpu_kjt_ops = {
    .offsets = cpu_offsets,
    .validate = cpu_validate,
    .segments = cpu_segments,
    .expand_map = cpu_expand_map,
    .bag_lengths = cpu_bag_lengths,
    .bag_copy = cpu_bag_copy,
    .expand_rows = cpu_expand_rows,
    .dedup = cpu_dedup,
    .from_rows = cpu_from_rows,
    .bucket_count = cpu_bucket_count,
    .bucket_fill = cpu_bucket_fill,
};
