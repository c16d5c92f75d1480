"""Where the f32 error of a DLRM's interaction gradient comes from: the top MLP's backward,
from the interaction output uvmrec dumped (scripts/bench/parity.lua --dump), in float64 and in
f32 several ways: autograd (cuBLAS as PyTorch calls it), and by hand with each product's sum over
K split into S parts added in f32 (split-K).  Prints each way's relative L2 error against
float64 and uvmrec's own (the dump's inter.grad).

    python scripts/bench/top_bwd_error.py --ckpt W.safetensors --dump G.safetensors [--device cuda]
"""
import argparse
import sys
import os

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dlrm import fail, read_safetensors  # noqa: E402


def layers(w):
    out, i = [], 1
    while f"dense.top.{i}.weight" in w:
        out.append((w[f"dense.top.{i}.weight"], w[f"dense.top.{i}.bias"]))
        i += 2
    return out


def forward(ls, z, dt):
    """The activations a hand backward needs: each layer's input and its ReLU mask."""
    xs, masks, x = [], [], z.to(dt)
    for n, (w, b) in enumerate(ls):
        xs.append(x)
        y = x @ w.to(dt).t() + b.to(dt)
        if n + 1 < len(ls):
            masks.append(y > 0)
            x = torch.relu(y)
        else:
            masks.append(None)
            x = y
    return xs, masks, x


def mm_split(a, b, s):
    """a @ b with the sum over K in s parts, each a product, added in a's dtype."""
    k = a.shape[1]
    if s <= 1 or k < 2 * s:
        return a @ b
    step = (k + s - 1) // s
    out = None
    for k0 in range(0, k, step):
        p = a[:, k0:k0 + step] @ b[k0:k0 + step]
        out = p if out is None else out + p
    return out


def backward(ls, logits, labels, masks, dt, s):
    g = (torch.sigmoid(logits.view(-1)) - labels.to(dt)) / labels.numel()
    g = g.view(-1, 1).to(dt)
    for n in range(len(ls) - 1, -1, -1):
        w = ls[n][0].to(dt)
        g = mm_split(g, w, s)
        if n > 0:
            g = g * masks[n - 1]
    return g


def rel(x, y):
    return float((x.double() - y.double()).norm() / y.double().norm())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    w, _ = read_safetensors(a.ckpt)
    d, _ = read_safetensors(a.dump)
    if "dense.top.1.weight" not in w:
        fail(f"{a.ckpt}: no dense.top.1.weight: not the weights parity.lua --ckpt writes")
    for k in ("inter", "batch.labels"):
        if k not in d:
            fail(f"{a.dump}: no tensor {k}: not a dump of parity.lua --dump")
    ls = [(x.to(dev), y.to(dev)) for x, y in layers(w)]
    if ls[0][0].shape[1] != d["inter"].shape[1]:
        fail(f"{a.dump}: the interaction's output has {d['inter'].shape[1]} columns, the top MLP's first layer "
             f"{ls[0][0].shape[1]}: not the same model")
    z, labels = d["inter"].to(dev), d["batch.labels"].to(dev)
    xs64, m64, lg64 = forward(ls, z, torch.float64)
    g64 = backward(ls, lg64, labels, m64, torch.float64, 1)
    print(f"top MLP backward from uvmrec's interaction output, batch {z.shape[0]}, on {dev.type}: "
          f"relative L2 error of the interaction's gradient against float64")
    if "inter.grad" in d:
        print(f"  uvmrec (the dump)                  {rel(d['inter.grad'].to(dev), g64):.3e}")
    zz = z.clone().requires_grad_(True)
    x = zz
    for n, (wt, b) in enumerate(ls):
        x = F.linear(x, wt, b)
        if n + 1 < len(ls):
            x = torch.relu(x)
    loss = F.binary_cross_entropy_with_logits(x.view(-1), labels, reduction="mean")
    loss.backward()
    print(f"  PyTorch f32 autograd               {rel(zz.grad, g64):.3e}")
    # The same masks as float64's, so that only the products' sums differ.
    for s in (1, 2, 4, 8, 16):
        g = backward(ls, lg64.float(), labels, m64, torch.float32, s)
        print(f"  f32, float64's masks, split-K {s:2d}   {rel(g, g64):.3e}")
    xs32, m32, lg32 = forward(ls, z, torch.float32)
    g = backward(ls, lg32, labels, m32, torch.float32, 1)
    print(f"  f32 forward and backward by hand   {rel(g, g64):.3e}")
    flips = sum(int((m32[i] != m64[i]).sum()) for i in range(len(ls) - 1))
    print(f"  ReLU masks f32 vs float64: {flips} of {sum(m.numel() for m in m64[:-1])} differ")


if __name__ == "__main__":
    main()
