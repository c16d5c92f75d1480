/* data.h: internals of the data path shared by npy.c, criteo.c, synth.c and loader.c. */
#ifndef UR_DATA_H
#define UR_DATA_H

#include <stdio.h>
#include "core/core.h"

/* A .npy file mapped read-only, its header checked against the file's size. */
typedef struct ur__npy_map_t {
  void *base;
  uint64_t file_bytes;
  ur_npy_info info;
  const void *data;
} ur__npy_map_t;
UR__HIDDEN ur_status ur__npy_map(const char *path, ur__npy_map_t *m);
UR__HIDDEN void ur__npy_unmap(ur__npy_map_t *m);
UR__HIDDEN uint64_t ur__npy_numel(const ur_npy_info *info);

/* A .npy written row by row; its header (fixed size) takes the row count on close.  The file is
 * written under a temporary name beside it (<path>.tmp-XXXXXX) and appears under its own name
 * only at commit, so a failed or killed writer leaves no file that looks complete: open,
 * append..., close (the header, fsync), commit (the rename); abort removes the temporary file
 * at any point before commit. */
#define UR__NPY_HEADER 128
typedef struct ur__npy_writer {
  FILE *f;
  char path[4096];
  char tmp[4096 + 16];    /* "" once committed or aborted */
  char descr[8];
  int ndim;
  int64_t inner[4];
  int64_t rows;
} ur__npy_writer;
UR__HIDDEN ur_status ur__npy_writer_open(ur__npy_writer *w, const char *path, const char *descr,
                                         int ndim, const int64_t *inner);
UR__HIDDEN ur_status ur__npy_writer_append(ur__npy_writer *w, const void *data, int64_t rows,
                                           size_t row_bytes);
UR__HIDDEN ur_status ur__npy_writer_close(ur__npy_writer *w);
UR__HIDDEN ur_status ur__npy_writer_commit(ur__npy_writer *w);
UR__HIDDEN void ur__npy_writer_abort(ur__npy_writer *w);

#endif
