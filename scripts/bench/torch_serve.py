"""PyTorch eager inference of an exported uvmrec model file, the peer of B11 (issue 23).

It reads the model file (safetensors, metadata uvmrec.model: the description uvmrec's serving
API reads) and builds the same DLRM for inference as a PyTorch expert would on a CPU: nn.Linear's
products (torch.nn.functional.linear), and for the tables PyTorch's own embedding bags: f32 rows
in F.embedding_bag, int8 rows in torch.ops.quantized.embedding_bag_byte_rowwise_offsets and int4
/ int2 rows in embedding_bag_4bit / 2bit_rowwise_offsets (FBGEMM's fused row-wise kernels, the
ones TorchRec's quantized collections call on a CPU).  uvmrec's rows hold the same codes with the
scale and bias in front (f16); they are moved behind the codes (f32 for 8-bit, f16 for 4 and 2
bits) as those ops take them, so every dequantized value is uvmrec's.  Ids are mapped as the
model's description says (modulo rows, then the row permutation).  Under torch.inference_mode.

    python3 scripts/bench/torch_serve.py --model M --dense D.npy --ids I.npy [--check P.npy]
        [--configs 4096x1,1x1,...] [--seconds S] [--device cpu|cuda] [--out F]

--check: uvmrec's probabilities of the first requests; the run stops (exit 1) unless PyTorch's
are within 2e-6 of them.  Then, for each configuration BATCHxTHREADS, THREADS Python threads
(PyTorch releases the GIL inside its ops) send batches back to back for S seconds after a warm-up
call each; a JSON line per configuration: samples/s and the p50 / p99 latency of a call.
"""
import argparse
import json
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dlrm import dot_interaction, dot_pairs, fail, read_safetensors  # noqa: E402


def as_numpy(t):
    return t.numpy() if t.dtype != torch.bfloat16 else t.float().numpy()


class ServeDLRM(torch.nn.Module):
    def __init__(self, d, tensors, device):
        super().__init__()
        if d.get("arch") != "dlrm":
            fail(f"architecture {d.get('arch')}: this peer is DLRM")
        self.d, self.device = d, device

        def dense(name):
            return tensors[name].float().to(device)

        self.bottom = [(dense(l["weight"]), dense(l["bias"]), l["act"] == "relu") for l in d["bottom"]]
        self.top = [(dense(l["weight"]), dense(l["bias"]), l["act"] == "relu") for l in d["top"]]
        self.cross = []
        for l in d.get("cross") or []:
            self.cross.append((dense(l["V"]) if "V" in l else None,
                               dense(l["U"]) if "U" in l else dense(l["weight"]), dense(l["bias"])))
        self.tables = []
        dim = d["dim"]
        for t in d["tables"]:
            rows = tensors[t["weights"]]
            fmt = t["format"]
            if fmt in ("f32", "fp16"):
                w = rows.float().to(device)
            elif device != "cpu":
                fail(f"table {t['name']}: {fmt} rows need FBGEMM's CPU kernels; on {device} PyTorch has none "
                     "without fbgemm_gpu")
            else:
                r = as_numpy(rows)
                scale, bias = r[:, 0:2].copy().view(np.float16), r[:, 2:4].copy().view(np.float16)
                nbytes = {"int8": dim, "int4": dim // 2, "int2": dim // 4}[fmt]
                codes = r[:, 4:4 + nbytes]
                if fmt == "int8":
                    qp = np.concatenate([scale.astype(np.float32).view(np.uint8), bias.astype(np.float32).view(np.uint8)], 1)
                else:
                    qp = np.concatenate([scale.view(np.uint8), bias.view(np.uint8)], 1)
                w = torch.from_numpy(np.ascontiguousarray(np.concatenate([codes, qp], 1)))
            perm = tensors[t["permutation"]].to(device) if t.get("permutation") else None
            self.tables.append((fmt, w, t["modulo"], perm, t["pooling"]))
        self.li, self.lj = dot_pairs(len(d["tables"]), d.get("self_interaction"), device)
        if d["interaction"] == "dot":
            # A training run's top MLP reads the interaction padded with zero columns to a
            # multiple of 8 (models/dlrm.lua); the file keeps those zero weights, dropped here.
            w, b, relu = self.top[0]
            self.top[0] = (w[:, :dim + len(self.li)].contiguous(), b, relu)

    @staticmethod
    def mlp(layers, x):
        for w, b, relu in layers:
            x = F.linear(x, w, b)
            if relu:
                x = torch.relu(x)
        return x

    def forward(self, dense, ids):
        """Probabilities [B] of dense f32 [B, D] and ids i64 [B, F] (one id a feature)."""
        B = dense.shape[0]
        x = self.mlp(self.bottom, dense)
        offsets = torch.arange(B, device=dense.device)
        pooled = []
        cols = ids.t().contiguous()  # one run of ids a feature, as the bags take them
        for f, (fmt, w, modulo, perm, pooling) in enumerate(self.tables):
            v = cols[f]
            if modulo > 0:
                v = v % modulo
            if perm is not None:
                v = perm[v]
            if fmt == "int8":
                e = torch.ops.quantized.embedding_bag_byte_rowwise_offsets(w, v, offsets, False, 0 if pooling == "sum" else 1)
            elif fmt == "int4":
                e = torch.ops.quantized.embedding_bag_4bit_rowwise_offsets(w, v, offsets, False, 0 if pooling == "sum" else 1)
            elif fmt == "int2":
                e = torch.ops.quantized.embedding_bag_2bit_rowwise_offsets(w, v, offsets, False, 0 if pooling == "sum" else 1)
            else:
                e = F.embedding_bag(v, w, offsets, mode=pooling)
            pooled.append(e)
        e = torch.cat(pooled, 1)
        if self.d["interaction"] == "dot":
            z = dot_interaction(x, e, self.li, self.lj)
        else:
            x0 = torch.cat([x, e], 1)
            z = x0
            for v, u, b in self.cross:
                h = F.linear(F.linear(z, v), u, b) if v is not None else F.linear(z, u, b)
                z = x0 * h + z
        return torch.sigmoid(self.mlp(self.top, z)).view(B)


def measure(model, dense, ids, batch, threads, seconds):
    n = dense.shape[0]
    lat = [[] for _ in range(threads)]
    start = threading.Barrier(threads)
    spans = [None] * threads

    def client(t):
        at = t * 7919 * batch
        with torch.inference_mode():
            def call(first):
                idx = (torch.arange(batch) + first) % n
                d, i = dense[idx], ids[idx]
                t0 = time.perf_counter()
                model(d, i)
                return time.perf_counter() - t0
            call(at)
            start.wait()
            began = time.perf_counter()
            while time.perf_counter() < began + seconds:
                at += batch
                lat[t].append(call(at))
            spans[t] = (began, time.perf_counter())

    ts = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    all_lat = sorted(x for l in lat for x in l)
    calls = len(all_lat)
    wall = max(s[1] for s in spans) - min(s[0] for s in spans)
    return {"batch": batch, "threads": threads, "calls": calls, "samples": calls * batch, "seconds": round(wall, 4),
            "samples_per_s": round(calls * batch / wall, 1), "p50_ms": round(1e3 * all_lat[(calls - 1) // 2], 4),
            "p99_ms": round(1e3 * all_lat[int((calls - 1) * 0.99)], 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dense", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--check")
    ap.add_argument("--configs", default="4096x1")
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    tensors, meta = read_safetensors(a.model)
    if meta.get("uvmrec.format") != "model":
        fail(f"{a.model}: uvmrec.format is {meta.get('uvmrec.format')}, not a model file (uvmrec export)")
    d = json.loads(meta["uvmrec.model"])
    model = ServeDLRM(d, tensors, a.device)
    del tensors
    dense = torch.from_numpy(np.load(a.dense)).to(a.device)
    ids = torch.from_numpy(np.load(a.ids).astype(np.int64)).to(a.device)
    fmt = sorted({t["format"] for t in d["tables"]})
    out = open(a.out, "a") if a.out else None
    if a.check:
        want = torch.from_numpy(np.load(a.check)).to(a.device)
        with torch.inference_mode():
            got = model(dense[:want.shape[0]], ids[:want.shape[0]])
        diff = float((got - want).abs().max())
        line = {"bench": "torch_serve", "check": "probabilities", "samples": int(want.shape[0]), "max_abs_diff": diff}
        print(json.dumps(line), flush=True)
        if diff > 2e-6:
            fail(f"PyTorch's probabilities differ from uvmrec's by {diff:.3g} (allowed 2e-6)", 1)
    for c in a.configs.split(","):
        b, t = (int(x) for x in c.split("x"))
        r = measure(model, dense, ids, b, t, a.seconds)
        r.update({"bench": "torch_serve", "engine": "pytorch", "format": "/".join(fmt), "device": a.device,
                  "torch": torch.__version__, "intra_op_threads": torch.get_num_threads()})
        print(json.dumps(r), flush=True)
        if out:
            out.write(json.dumps(r) + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
