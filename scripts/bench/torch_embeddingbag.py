#!/usr/bin/env python3
"""PyTorch's nn.EmbeddingBag on the shapes of scripts/bench/tbe.lua (BENCH.md B1, B2), for the
ratio: 26 tables of dim 128 (8 GiB in HBM), batch 65536, 1 and 20 ids per bag, uniform and
Zipf(1.05) ids scattered over each table, f32 and f16.  Forward, and forward + backward with
SGD on sparse gradients (the usual way to train large tables in PyTorch).  Two layouts: one
EmbeddingBag per table (the common model code), and one EmbeddingBag over all tables with
shifted ids (a single launch, PyTorch's fastest path); tbe.lua takes the faster for its ratio.
Timed with CUDA events: median of many runs after a warm-up, rotating over batches.

    python3 scripts/bench/torch_embeddingbag.py [--out FILE] [--quick]

Runs only where PyTorch and a GPU are present; elsewhere it says so and exits 0."""
import argparse
import json
import sys

try:
    import torch
except ImportError:
    print("torch_embeddingbag: PyTorch is not installed; skipped")
    sys.exit(0)

TABLES, DIM, BATCH = 26, 128, 65536
ROWS = (8 << 30) // TABLES // (DIM * 4)
ZIPF_S = 1.05
PERM_MUL, PERM_ADD = 2654435761, 40503


def ids(n, dist, gen):
    """n ids in [0, ROWS): uniform, or Zipf by the continuous inverse CDF, then scattered."""
    if dist == "uniform":
        return torch.randint(0, ROWS, (n,), device="cuda", generator=gen)
    e = 1.0 - ZIPF_S
    u = torch.rand(n, device="cuda", dtype=torch.float64, generator=gen)
    x = torch.floor((1 + u * (ROWS ** e - 1)) ** (1 / e)).long() - 1
    x = x.clamp_(0, ROWS - 1)
    return (x * (PERM_MUL % ROWS) + PERM_ADD) % ROWS


def median_ms(fn, batches, warm, runs):
    for i in range(warm):
        fn(batches[i % len(batches)])
    torch.cuda.synchronize()
    times = []
    for i in range(runs):
        b = batches[i % len(batches)]
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(b)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[(runs + 1) // 2 - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_embeddingbag: no GPU; skipped")
        return
    warm, runs = 5, 10 if a.quick else 30
    out = open(a.out, "w") if a.out else None
    name = torch.cuda.get_device_name(0)
    rows = []

    def report(case, op, ms, layout):
        r = {"bench": "torch_embeddingbag", "case": case, "op": op, "ms": ms, "layout": layout,
             "torch": torch.__version__, "device": name}
        rows.append(r)
        if out:
            out.write(json.dumps(r) + "\n")
            out.flush()

    for dtype, dname in ((torch.float32, "f32"), (torch.float16, "f16")):
        shapes = [(1, "uniform"), (1, "zipf"), (20, "uniform"), (20, "zipf")]
        if dname == "f16":
            shapes = shapes[:2]
        for layout in ("per-table", "concat"):
            gen = torch.Generator(device="cuda")
            gen.manual_seed(1)
            if layout == "per-table":
                bags = [torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True).to("cuda", dtype)
                        for _ in range(TABLES)]
            else:
                bags = [torch.nn.EmbeddingBag(ROWS * TABLES, DIM, mode="sum", sparse=True).to("cuda", dtype)]
            params = [p for m in bags for p in m.parameters()]
            opt = torch.optim.SGD(params, lr=0.01)
            for hot, dist in shapes:
                case = "device %s %d-hot %s" % (dname, hot, dist)
                batches = []
                for _ in range(2 if hot > 1 else 3):
                    v = ids(TABLES * BATCH * hot, dist, gen)
                    if layout == "per-table":
                        per = BATCH * hot
                        offs = torch.arange(0, per, hot, device="cuda")
                        batches.append([(v[t * per:(t + 1) * per], offs) for t in range(TABLES)])
                    else:
                        shift = torch.arange(TABLES, device="cuda").repeat_interleave(BATCH * hot) * ROWS
                        offs = torch.arange(0, TABLES * BATCH * hot, hot, device="cuda")
                        batches.append([(v + shift, offs)])
                grad = torch.rand(BATCH, TABLES * DIM, device="cuda", dtype=dtype, generator=gen)

                def forward(b):
                    outs = [m(x, o) for m, (x, o) in zip(bags, b)]
                    if layout == "per-table":
                        return torch.cat(outs, dim=1)
                    return outs[0].view(TABLES, BATCH, DIM).transpose(0, 1).reshape(BATCH, TABLES * DIM)

                def train(b):
                    opt.zero_grad(set_to_none=True)
                    forward(b).backward(grad)
                    opt.step()

                with torch.no_grad():
                    report(case, "forward", median_ms(forward, batches, warm, runs), layout)
                report(case, "forward+sgd", median_ms(train, batches, warm, runs), layout)
                del batches
            del bags, params, opt
            torch.cuda.empty_cache()

    print("PyTorch %s nn.EmbeddingBag on %s" % (torch.__version__, name))
    print("%-34s %-14s %-10s %9s" % ("case", "op", "layout", "ms"))
    for r in rows:
        print("%-34s %-14s %-10s %9.3f" % (r["case"], r["op"], r["layout"], r["ms"]))
    if out:
        out.close()


if __name__ == "__main__":
    main()
