/* loader_check.c: the loader's clean endings, for valgrind (spec/data/loader_spec.lua runs it):
 * a stop in the middle of an epoch with every slot full, a stop right after opening, and an
 * error in the loader thread (a bad TSV line) reported to the consumer.  Exit 0 when all
 * behave; valgrind then reports leaks and bad accesses.  Usage: loader_check BAD.tsv */
#include <stdio.h>
#include <string.h>
#include "uvmrec.h"

static int fail(const char *what) {
  fprintf(stderr, "loader_check: %s: %s\n", what, ur_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: loader_check BAD.tsv\n");
    return 2;
  }
  ur_synth_spec spec;
  ur_synth_table tabs[3];
  memset(&spec, 0, sizeof spec);
  memset(tabs, 0, sizeof tabs);
  spec.tables = tabs;
  spec.num_tables = 3;
  spec.num_dense = 4;
  spec.seed = 7;
  for (int t = 0; t < 3; t++) {
    tabs[t].rows = 100 * (t + 1);
    tabs[t].zipf = 1.1;
    tabs[t].hot_min = t == 2 ? 0 : 1;
    tabs[t].hot_max = t == 2 ? 3 : 1;
    tabs[t].signal = 0.5f;
  }
  ur_loader_opts o;
  memset(&o, 0, sizeof o);
  o.source = UR_SOURCE_SYNTHETIC;
  o.synth = &spec;
  o.samples = 5000;
  o.batch_size = 128;
  o.depth = 3;
  o.shuffle_window = 1000;
  o.epochs = 2;
  o.world = 1;
  o.placement = UR_PLACE_PINNED;
  ur_loader *l;
  ur_batch *b;
  /* 1. Take two batches, hold one, let the thread fill every slot, then stop. */
  if (ur_loader_open(&l, &o)) return fail("open");
  if (ur_loader_next(l, &b) || !b) return fail("next");
  ur_batch *held = b;
  if (ur_loader_next(l, &b) || !b) return fail("next");
  ur_loader_release(l, held);
  ur_loader_close(l); /* b is not released: close frees it */
  /* 2. Stop at once. */
  if (ur_loader_open(&l, &o)) return fail("open");
  ur_loader_close(l);
  /* 3. An error in the thread reaches the consumer after the good batches. */
  memset(&o, 0, sizeof o);
  const char *paths[1] = {argv[1]};
  o.source = UR_SOURCE_CRITEO_TSV;
  o.paths = paths;
  o.npaths = 1;
  o.batch_size = 16;
  o.depth = 2;
  o.epochs = 1;
  o.world = 1;
  if (ur_loader_open(&l, &o)) return fail("open tsv");
  int batches = 0;
  ur_status st;
  while (!(st = ur_loader_next(l, &b)) && b) {
    batches++;
    ur_loader_release(l, b);
  }
  if (!st) {
    fprintf(stderr, "loader_check: the bad line was not reported\n");
    return 1;
  }
  printf("error after %d batches: %s\n", batches, ur_last_error());
  ur_loader_close(l);
  /* 4. The same error while the consumer stops early, before reaching it. */
  if (ur_loader_open(&l, &o)) return fail("open tsv");
  ur_loader_close(l);
  printf("loader_check: ok\n");
  return 0;
}
