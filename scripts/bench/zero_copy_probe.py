# Zero-copy rows on the GPU (the cache's row mover, kernels/cache.cu move_rows, reads and writes
# host rows in place): 512-byte rows of a pinned table of SIZE GiB gathered into and scattered
# from device memory by a warp a row, 1 M rows a pass, ids uniform over the table and the same
# ids sorted, for three allocations: cudaHostAlloc, and mmap + madvise(MADV_HUGEPAGE or
# MADV_NOHUGEPAGE) + cudaHostRegister (kernels/backend.cu's path for 64 MiB and more).  Checks
# the gathered rows, prints GB/s of row bytes (the fastest of 4 passes).  Needs CuPy (the GPU
# machine has it):  python3 scripts/bench/zero_copy_probe.py [SIZE_GIB]   (default 8)
import ctypes, sys
import numpy as np, cupy as cp
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
GiB = 1 << 30
SIZE = int(sys.argv[1]) * GiB if len(sys.argv) > 1 else 8 * GiB
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
}'''
mod = cp.RawModule(code=src)
gather, scatter = mod.get_function("gather"), mod.get_function("scatter")
def meminfo(key):
    for l in open("/proc/meminfo"):
        if l.startswith(key): return l.split(":")[1].strip()
print("THP enabled:", open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(),
      "defrag:", open("/sys/kernel/mm/transparent_hugepage/defrag").read().strip(), "size %d GiB" % (SIZE // GiB))
rng = np.random.default_rng(1)
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
