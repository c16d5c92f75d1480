# Zero-copy rows on the GPU (the cache's row mover, kernels/cache.cu move_lists, reads and writes
# host rows in place): 512-byte rows of a pinned table of SIZE GiB gathered into and scattered
# from device memory by a warp a row, 1 M rows a pass, ids uniform over the table and the same
# ids sorted, for three allocations: cudaHostAlloc, and mmap + madvise(MADV_HUGEPAGE or
# MADV_NOHUGEPAGE) + cudaHostRegister (kernels/backend.cu's path for 64 MiB and more).  Checks
# the gathered rows, prints GB/s of row bytes (the fastest of 4 passes).  With --both N (cudaHostAlloc
# only): N sorted rows read and N other sorted rows written, one direction alone, then both at once
# (one kernel whose even blocks read and odd blocks write, and two kernels on two streams): does
# the link carry the cache's fills and write-backs together?  --tables T (with --both): the table
# split into T allocations as the cache's tables are (mmap + MADV_HUGEPAGE + cudaHostRegister
# each), a row found through a device array of their addresses as the cache's mover finds it.
# Needs CuPy (the GPU machine has it):
#   python3 scripts/bench/zero_copy_probe.py [SIZE_GIB] [--both N [--tables T]]   (default 8 GiB)
import ctypes, sys
import numpy as np, cupy as cp
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
GiB = 1 << 30
args = sys.argv[1:]
BOTH = int(args[args.index("--both") + 1]) if "--both" in args else 0
if BOTH: del args[args.index("--both"):args.index("--both") + 2]
TABLES = int(args[args.index("--tables") + 1]) if "--tables" in args else 0
if TABLES: del args[args.index("--tables"):args.index("--tables") + 2]
SIZE = int(args[0]) * GiB if args else 8 * GiB
ROW = 512
ROWS = SIZE // ROW
N = 1 << 20
src = r'''
extern "C" __global__ void gather(const uint4* __restrict__ h, uint4* d, const long long* ids, long long n) {
  long long w = (long long)blockIdx.x * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w < n) d[w * 32 + lane] = h[ids[w] * 32 + lane];
}
extern "C" __global__ void scatter(uint4* h, const uint4* __restrict__ d, const long long* ids, long long n) {
  long long w = (long long)blockIdx.x * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w < n) h[ids[w] * 32 + lane] = d[w * 32 + lane];
}
extern "C" __global__ void both(uint4* h, uint4* d, const long long* rid, const long long* wid, long long n) {
  long long w = (long long)(blockIdx.x / 2) * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w >= n) return;
  if (blockIdx.x % 2 == 0) d[w * 32 + lane] = h[rid[w] * 32 + lane];
  else h[wid[w] * 32 + lane] = d[(n + w) * 32 + lane];
}
__device__ uint4* row_t(uint4* const* bases, long long per, long long id) { return bases[id / per] + (id % per) * 32; }
extern "C" __global__ void gather_t(uint4* const* b, long long per, uint4* d, const long long* ids, long long n) {
  long long w = (long long)blockIdx.x * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w < n) d[w * 32 + lane] = row_t(b, per, ids[w])[lane];
}
extern "C" __global__ void scatter_t(uint4* const* b, long long per, const uint4* d, const long long* ids, long long n) {
  long long w = (long long)blockIdx.x * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w < n) row_t(b, per, ids[w])[lane] = d[w * 32 + lane];
}
extern "C" __global__ void both_t(uint4* const* b, long long per, uint4* d, const long long* rid, const long long* wid,
                                  long long n) {
  long long w = (long long)(blockIdx.x / 2) * 8 + threadIdx.x / 32; int lane = threadIdx.x % 32;
  if (w >= n) return;
  if (blockIdx.x % 2 == 0) d[w * 32 + lane] = row_t(b, per, rid[w])[lane];
  else row_t(b, per, wid[w])[lane] = d[(n + w) * 32 + lane];
}'''
mod = cp.RawModule(code=src)
gather, scatter, both = mod.get_function("gather"), mod.get_function("scatter"), mod.get_function("both")
gather_t, scatter_t, both_t = (mod.get_function(k) for k in ("gather_t", "scatter_t", "both_t"))
def meminfo(key):
    for l in open("/proc/meminfo"):
        if l.startswith(key): return l.split(":")[1].strip()
print("THP enabled:", open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
      "defrag:", open("/sys/kernel/mm/transparent_hugepage/defrag").read().strip(), "size %d GiB" % (SIZE // GiB))
rng = np.random.default_rng(1)
def best_ms(run, passes=8):
    best = 1e9
    for _ in range(passes):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(); run(); e1.record(); e1.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(e0, e1))
    return best
def report(runs, n, d, rid, where):
    """Each run timed (the fastest of 8), its gathered rows checked, a line printed."""
    for name, run in runs:
        ms = best_ms(run)
        moved = n * ROW * (2 if name.startswith(("read then", "both")) else 1)
        got = d.view(cp.int64).reshape(2 * n, ROW // 8)[:n, 0].get()
        assert (got == cp.asnumpy(rid)).all(), name + ": gathered rows differ"
        print("both %d rows of %d GiB%s: %-18s %8.3f ms %6.1f GB/s" % (n, SIZE // GiB, where, name, ms,
                                                                      moved / ms / 1e6), flush=True)
if BOTH and TABLES:
    n, per = BOTH, ROWS // TABLES
    maps, bases = [], []
    for t in range(TABLES):
        q = libc.mmap(None, per * ROW, 3, 0x22, -1, 0)
        libc.madvise(q, per * ROW, 14)
        libc.memset(q, 1, per * ROW)
        cp.cuda.runtime.hostRegister(q, per * ROW, 2 | 1)
        h = np.ctypeslib.as_array(ctypes.cast(q, ctypes.POINTER(ctypes.c_int64)), shape=(per, ROW // 8))
        h[:, 0] = np.arange(t * per, (t + 1) * per)
        maps.append(q); bases.append(q)
    B = cp.asarray(np.array(bases, dtype=np.uint64))
    ids = rng.permutation(per * TABLES)[:2 * n]
    rid, wid = cp.asarray(np.sort(ids[:n])), cp.asarray(np.sort(ids[n:]))
    d = cp.zeros(2 * n * ROW, dtype=cp.uint8)
    g = ((n + 7) // 8,)
    P = np.int64(per)
    runs = (("read alone", lambda: gather_t(g, (256,), (B, P, d, rid, np.int64(n)))),
            ("write alone", lambda: scatter_t(g, (256,), (B, P, d[n * ROW:], wid, np.int64(n)))),
            ("read then write", lambda: (gather_t(g, (256,), (B, P, d, rid, np.int64(n))),
                                         scatter_t(g, (256,), (B, P, d[n * ROW:], wid, np.int64(n))))),
            ("both, one kernel", lambda: both_t((2 * g[0],), (256,), (B, P, d, rid, wid, np.int64(n)))))
    report(runs, n, d, rid, " in %d tables" % TABLES)
    for q in maps:
        cp.cuda.runtime.hostUnregister(q)
        libc.munmap(q, per * ROW)
    sys.exit(0)
if BOTH:
    n = BOTH
    p = cp.cuda.runtime.hostAlloc(SIZE, 2 | 1)
    libc.memset(p, 1, SIZE)
    host = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_int64)), shape=(ROWS, ROW // 8))
    host[:, 0] = np.arange(ROWS)
    ids = rng.permutation(ROWS)[:2 * n]
    rid, wid = cp.asarray(np.sort(ids[:n])), cp.asarray(np.sort(ids[n:]))
    d = cp.zeros(2 * n * ROW, dtype=cp.uint8)
    g = ((n + 7) // 8,)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    def two():
        ev = cp.cuda.Event(); ev.record()
        s1.wait_event(ev); s2.wait_event(ev)
        gather(g, (256,), (np.uint64(p), d, rid, np.int64(n)), stream=s1)
        scatter(g, (256,), (np.uint64(p), d[n * ROW:], wid, np.int64(n)), stream=s2)
        for s in (s1, s2):
            e = cp.cuda.Event(); e.record(s); cp.cuda.get_current_stream().wait_event(e)
    runs = (("read alone", lambda: gather(g, (256,), (np.uint64(p), d, rid, np.int64(n)))),
            ("write alone", lambda: scatter(g, (256,), (np.uint64(p), d[n * ROW:], wid, np.int64(n)))),
            ("read then write", lambda: (gather(g, (256,), (np.uint64(p), d, rid, np.int64(n))),
                                         scatter(g, (256,), (np.uint64(p), d[n * ROW:], wid, np.int64(n))))),
            ("both, one kernel", lambda: both((2 * g[0],), (256,), (np.uint64(p), d, rid, wid, np.int64(n)))),
            ("both, two streams", two))
    report(runs, n, d, rid, "")
    cp.cuda.runtime.freeHost(p)
    sys.exit(0)
ids_u = rng.integers(0, ROWS, N, dtype=np.int64)
ids_s = np.sort(ids_u)
dev = cp.empty(N * ROW, dtype=cp.uint8)
def bench(name, ptr):
    host = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int64)), shape=(ROWS, ROW // 8))
    host[:, 0] = np.arange(ROWS)
    dptr = ptr  # unified addressing: registered and mapped memory is read at its host address
    res = []
    for kind, ids in (("uniform", ids_u), ("sorted", ids_s)):
        di = cp.asarray(ids)
        for fn, what in ((gather, "read"), (scatter, "write")):
            best = 1e9
            for _ in range(4):
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record()
                fn(((N + 7) // 8,), (256,), (np.uint64(dptr), dev, di, np.int64(N)))
                e1.record(); e1.synchronize()
                best = min(best, cp.cuda.get_elapsed_time(e0, e1))
            if what == "read":
                got = dev.view(cp.int64).reshape(N, ROW // 8)[:, 0].get()
                assert (got == ids).all(), name + ": gathered rows differ"
            res.append("%s %s %.1f GB/s" % (kind, what, N * ROW / best / 1e6))
    print("%-34s %s" % (name, "; ".join(res)), flush=True)
p = cp.cuda.runtime.hostAlloc(SIZE, 2 | 1)
libc.memset(p, 1, SIZE)
bench("cudaHostAlloc", p)
cp.cuda.runtime.freeHost(p)
for adv, name in ((14, "mmap + MADV_HUGEPAGE + register"), (15, "mmap + MADV_NOHUGEPAGE + register")):
    before = meminfo("AnonHugePages")
    p = libc.mmap(None, SIZE, 3, 0x22, -1, 0)
    r = libc.madvise(p, SIZE, adv)
    libc.memset(p, 1, SIZE)
    print("  madvise rc %d; AnonHugePages %s -> %s" % (r, before, meminfo("AnonHugePages")), flush=True)
    cp.cuda.runtime.hostRegister(p, SIZE, 2 | 1)
    bench(name, p)
    cp.cuda.runtime.hostUnregister(p)
    libc.munmap(p, SIZE)
