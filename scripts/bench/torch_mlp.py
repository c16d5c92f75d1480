"""The MLPerf v1 DLRM MLP stack in PyTorch, timed as scripts/bench/mlp.lua times uvmrec's.

Bottom 13-512-256-128 and top 479-1024-1024-512-256-1 (ReLU after every layer but the last),
forward + backward with the top MLP's input gradient and none for the bottom's input, at one
batch size, in f32 (TF32 off), TF32 and bf16 (autocast, f32 master weights).  Median of timed
steps after a warm-up, with CUDA events.  Prints a table and writes JSON lines (--out) that
mlp.lua --torch reads for the ratio.

    python3 scripts/bench/torch_mlp.py [--batch 65536] [--runs 30] [--out FILE]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dlrm import time_it  # noqa: E402

BOTTOM = [13, 512, 256, 128]
TOP = [479, 1024, 1024, 512, 256, 1]


def mlp(sizes, last_relu):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def flops(rows):
    f = 0
    for sizes in (BOTTOM, TOP):
        for i in range(len(sizes) - 1):
            mm = 2 * rows * sizes[i] * sizes[i + 1]
            f += mm * (2 if sizes is BOTTOM and i == 0 else 3)
    return f


def run(precision, batch, runs, warm=5):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.manual_seed(0)
    bottom, top = mlp(BOTTOM, True), mlp(TOP, False)
    act = torch.bfloat16 if precision == "bf16" else torch.float32
    xb = torch.rand(batch, BOTTOM[0], device="cuda") * 2 - 1
    xt = (torch.rand(batch, TOP[0], device="cuda") * 2 - 1).to(act).requires_grad_()
    gb = (torch.rand(batch, BOTTOM[-1], device="cuda") * 2 - 1).to(act)
    gt = (torch.rand(batch, 1, device="cuda") * 2 - 1).to(act)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            yb = bottom(xb)
            yt = top(xt)
        torch.autograd.backward([yb, yt], [gb.to(yb.dtype), gt.to(yt.dtype)])

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    return time_it(step, runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_mlp: no GPU for PyTorch")
    f = flops(a.batch)
    out = open(a.out, "w") if a.out else None
    print(f"PyTorch {torch.__version__} MLP stack, batch {a.batch}, {torch.cuda.get_device_name()}")
    print(f"{'math':6} {'ms':>10} {'TFLOP/s':>10}")
    for p in ("f32", "tf32", "bf16"):
        ms = run(p, a.batch, a.runs)
        tf = f / (ms * 1e-3) / 1e12
        print(f"{p:6} {ms:10.3f} {tf:10.1f}")
        if out:
            out.write(json.dumps({"bench": "torch_mlp", "precision": p, "batch": a.batch,
                                  "ms": round(ms, 4), "tflops": round(tf, 2)}) + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
