"""DLRM in plain PyTorch, to check and measure uvmrec against (issue 9).

The model is DLRM as models/dlrm.lua builds it: a bottom MLP (ReLU after every layer), one
nn.EmbeddingBag per table (sum or mean, sparse gradients), DLRM's dot interaction (the lower
triangle of the pairwise dot products, i-major, after the bottom output) or DCNv2's cross layers
over the bottom output and the embeddings side by side, a top MLP to one logit, and
binary cross-entropy on the logit.  It reads uvmrec's checkpoints (safetensors, read here without
the safetensors package) and uvmrec's binary day files (day_N_{dense,sparse,labels}.npy, ids
modulo each table's rows as uvmrec's loader takes them), so both engines see the same weights and
the same data.  The description of the model and of both optimizers comes from the checkpoint
(metadata uvmrec.meta.torch, written by scripts/bench/parity_lib.lua), so no default is
written twice.

Precision as uvmrec's: f32; tf32 (f32 tensors, TF32 products on the GPU); bf16 (bf16
activations and products with f32 accumulation, f32 master weights, the embeddings pooled in f32
and rounded to bf16, the loss in f32).

    python3 scripts/bench/torch_dlrm.py parity --ckpt W --dump G --data DIR [--device cpu|cuda]
        compares the step uvmrec wrote (scripts/bench/parity.lua) with this model's on the same
        weights and batch: outputs, loss, every dense gradient and the deduplicated gradient of
        every table (its rows exactly, its values within a tolerance); prints a table, exit 1 on
        a mismatch.
    python3 scripts/bench/torch_dlrm.py train --ckpt W --data DIR --eval-data DIR --steps N --out F
        trains with the checkpoint's optimizers and schedule on the day files in order (no
        shuffle: uvmrec's loader with shuffle_window 0 gives the same batches), writes the loss
        every log_every steps and the final exact AUC as JSON lines.
    python3 scripts/bench/torch_dlrm.py speed --desc D.json --data DIR --precision P --out F
        samples/s of whole training steps (tables stepped by sparse SGD or the checkpoint's
        optimizer), CUDA events, median; --ceilings also measures the GPU's matrix-product and
        copy ceilings in the same process.
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

# ---- safetensors, read by hand: 8-byte LE header length, JSON header, raw LE data ----

ST_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.int16, 2), "I8": (np.int8, 1),
             "U8": (np.uint8, 1), "I32": (np.int32, 4), "I64": (np.int64, 8)}


def fail(msg, code=2):
    print(f"torch_dlrm: {msg}", file=sys.stderr)
    sys.exit(code)


def read_safetensors(path, names=None):
    """{name: torch tensor (a copy, on the CPU)} and the metadata; names: only these."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                fail(f"{path}: {len(head)} bytes; a safetensors file starts with an 8-byte header length")
            n = struct.unpack("<Q", head)[0]
            if n > 100_000_000 or 8 + n > size:
                fail(f"{path}: header length {n} runs past the file's {size} bytes")
            header = json.loads(f.read(n))
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    except ValueError as e:
        fail(f"{path}: the header is not JSON ({e})")
    meta = header.pop("__metadata__", None) or {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if names is not None and name not in names:
            continue
        dt, shape, (b, e) = info.get("dtype"), info.get("shape"), info.get("data_offsets", (0, -1))
        if dt not in ST_DTYPES:
            fail(f"{path}: tensor {name} has dtype {dt}; expected one of {', '.join(ST_DTYPES)}")
        npdt, width = ST_DTYPES[dt]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * width or b < 0 or e > len(data):
            fail(f"{path}: tensor {name}: offsets [{b}, {e}) do not hold {dt} {shape} inside {len(data)} data bytes")
        t = torch.from_numpy(np.frombuffer(data[b:e], dtype=npdt).copy()).reshape(shape)
        out[name] = t.view(torch.bfloat16) if dt == "BF16" else t
    return out, meta


def description(meta, path):
    text = meta.get("uvmrec.meta.torch")
    if text is None:
        fail(f"{path}: no uvmrec.meta.torch in the metadata (written by scripts/bench/parity.lua, "
             "train_parity.lua or dlrm_speed.lua)")
    d = json.loads(text)
    if d.get("format") != 1:
        fail(f"{path}: description format {d.get('format')}; expected 1")
    return d


# ---- day files ----

class DayFiles:
    """uvmrec's binary day files in DIR, read in order as one sequence of samples."""

    def __init__(self, path, rows):
        self.path, self.rows = path, rows
        days = []
        n = 0
        while os.path.exists(os.path.join(path, f"day_{n}_dense.npy")):
            p = os.path.join(path, f"day_{n}_")
            try:
                d = (np.load(p + "dense.npy", mmap_mode="r"), np.load(p + "sparse.npy", mmap_mode="r"),
                     np.load(p + "labels.npy", mmap_mode="r"))
            except (OSError, ValueError) as e:
                fail(f"{p}*.npy: {e}")
            if os.path.exists(p + "weights.npy"):
                fail(f"{p}weights.npy: weighted ids are not supported by this model")
            if d[0].shape[0] != d[1].shape[0] or d[0].shape[0] != d[2].shape[0]:
                fail(f"{p}*.npy: {d[0].shape[0]} dense rows, {d[1].shape[0]} sparse, {d[2].shape[0]} labels")
            days.append(d)
            n += 1
        if not days:
            fail(f"{path}: no day_0_dense.npy (expected the day files of uvmrec datagen or convert)")
        self.days = days
        self.starts = np.cumsum([0] + [d[0].shape[0] for d in days])
        self.total = int(self.starts[-1])
        H = days[0][1].shape[1]
        hot = [1] * len(rows)
        lay = os.path.join(path, "layout.txt")
        if os.path.exists(lay):
            for line in open(lay):
                if line.startswith("hot "):
                    hot = [int(h.split("-")[-1]) for h in line[4:].strip().split(",")]
        if len(hot) != len(rows) or sum(hot) != H:
            fail(f"{path}: {H} sparse columns for {len(rows)} tables (ids per table {hot}); the model has "
                 f"{len(rows)} tables")
        self.cols = np.cumsum([0] + hot)

    def read(self, first, n):
        """dense f32 [n, D], labels f32 [n], per table (values i64, offsets i64) of samples
        first .. first + n - 1."""
        n = min(n, self.total - first)
        parts = []
        at = first
        while at < first + n:
            i = int(np.searchsorted(self.starts, at, side="right")) - 1
            r0 = at - int(self.starts[i])
            k = min(first + n - at, int(self.starts[i + 1]) - at)
            d = self.days[i]
            parts.append((d[0][r0:r0 + k], d[1][r0:r0 + k], d[2][r0:r0 + k]))
            at += k
        dense = np.concatenate([p[0] for p in parts]).astype(np.float32)
        ids = np.concatenate([p[1] for p in parts]).astype(np.int64)
        labels = np.concatenate([p[2] for p in parts]).reshape(n).astype(np.float32)
        sparse = []
        for t, rows in enumerate(self.rows):
            block = ids[:, self.cols[t]:self.cols[t + 1]]
            keep = np.cumprod(block >= 0, axis=1).astype(bool)  # a -1 ends a bag
            lengths = keep.sum(axis=1)
            values = block[keep] % rows
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            sparse.append((values, offsets))
        return dense, labels, sparse


def to_device(batch, device):
    dense, labels, sparse = batch
    return (torch.from_numpy(dense).to(device), torch.from_numpy(labels).to(device),
            [(torch.from_numpy(v).to(device), torch.from_numpy(o).to(device)) for v, o in sparse])


# ---- the model ----

class DLRM(torch.nn.Module):
    """init: draw the tables (uniform(+-1/sqrt(rows)), as uvmrec's) instead of leaving them for load()."""

    def __init__(self, d, device, init=False):
        super().__init__()
        self.d = d
        self.act = torch.bfloat16 if d["precision"] == "bf16" else torch.float32
        self.names = {}  # uvmrec's parameter names -> parameters

        def mlp(prefix, sizes):
            layers = torch.nn.ModuleList()
            for i in range(len(sizes) - 1):
                lin = torch.nn.Linear(sizes[i], sizes[i + 1], device=device)
                layers.append(lin)
                # uvmrec's MLP is a Sequential of Linear, ReLU, ...: Linear k is child 2k+1.
                self.names[f"{prefix}.{2 * i + 1}.weight"] = lin.weight
                self.names[f"{prefix}.{2 * i + 1}.bias"] = lin.bias
            return layers

        self.bottom = mlp("bottom", d["bottom"])
        self.top = mlp("top", d["top"])
        mode = d["pooling"]
        self.emb = torch.nn.ModuleList()
        for name, rows in zip(d["tables"], d["rows"]):
            # _weight: no initialisation of PyTorch's own (seconds for 33.8 M rows on a CPU).
            e = torch.nn.EmbeddingBag(rows, d["dim"], mode=mode, sparse=True,
                                      _weight=torch.empty(rows, d["dim"], device=device))
            if init:
                with torch.no_grad():
                    bound = 1 / math.sqrt(rows)
                    e.weight.uniform_(-bound, bound)
            self.emb.append(e)
        self.cross = torch.nn.ParameterList()
        width = d["bottom"][-1] + len(d["rows"]) * d["dim"]
        if d["interaction"] == "dcnv2":
            r = d["cross_rank"]
            for layer in range(1, d["cross_layers"] + 1):
                if r > 0:
                    shapes = [("V", (r, width)), ("U", (width, r))]
                else:
                    shapes = [("weight", (width, width))]
                for kind, shape in shapes + [("bias", (width,))]:
                    p = torch.nn.Parameter(torch.randn(shape, device=device) / math.sqrt(width))
                    self.cross.append(p)
                    self.names[f"interaction.{kind}_{layer}"] = p
        elif d["interaction"] == "dot":
            n = len(d["rows"]) + 1
            extra = 1 if d["self_interaction"] else 0
            self.li = torch.tensor([i for i in range(n) for j in range(i + extra)], device=device)
            self.lj = torch.tensor([j for i in range(n) for j in range(i + extra)], device=device)
        else:
            fail(f"interaction {d['interaction']}: expected dot or dcnv2")
        self.dense_names = list(self.names)

    def load(self, tensors, path):
        with torch.no_grad():
            for name, p in self.names.items():
                t = tensors.get("dense." + name)
                if t is None:
                    fail(f"{path}: no tensor dense.{name}")
                if tuple(t.shape) != tuple(p.shape):
                    fail(f"{path}: dense.{name} is {list(t.shape)}; this model's is {list(p.shape)}")
                p.copy_(t.float())
            for name, e in zip(self.d["tables"], self.emb):
                t = tensors.get("embeddings." + name)
                if t is None:
                    fail(f"{path}: no tensor embeddings.{name}")
                if tuple(t.shape) != tuple(e.weight.shape):
                    fail(f"{path}: embeddings.{name} is {list(t.shape)}; the table is {list(e.weight.shape)}")
                e.weight.copy_(t.float())

    def _mlp(self, layers, x, last_relu):
        a = self.act
        for i, lin in enumerate(layers):
            x = F.linear(x, lin.weight.to(a), lin.bias.to(a))
            if i < len(layers) - 1 or last_relu:
                x = torch.relu(x)
        return x

    def forward(self, dense, sparse, keep=None):
        """Logits [B, 1] in the activation dtype; keep: a dict that receives the pooled
        embeddings and the interaction's output."""
        a = self.act
        x = self._mlp(self.bottom, dense.to(a), True)
        pooled = torch.cat([e(v, o) for e, (v, o) in zip(self.emb, sparse)], 1)
        e = pooled.to(a)
        B = x.shape[0]
        if self.d["interaction"] == "dot":
            T = torch.cat([x, e], 1).view(B, -1, x.shape[1])
            Z = torch.bmm(T, T.transpose(1, 2))
            z = torch.cat([x, Z[:, self.li, self.lj]], 1)
        else:
            x0 = torch.cat([x, e], 1)
            xl = x0
            ps = list(self.cross)
            per = 3 if self.d["cross_rank"] > 0 else 2
            for layer in range(self.d["cross_layers"]):
                q = ps[layer * per:(layer + 1) * per]
                if per == 3:
                    h = F.linear(F.linear(xl, q[0].to(a)), q[1].to(a), q[2].to(a))
                else:
                    h = F.linear(xl, q[0].to(a), q[1].to(a))
                if a == torch.bfloat16:
                    # One rounding, as uvmrec's fused kernel: x0 * h + xl in f32, then to bf16.
                    xl = (x0.float() * h.float() + xl.float()).to(a)
                else:
                    xl = x0 * h + xl
            z = xl
        if keep is not None:
            keep["pooled"], keep["inter"] = e, z
        return self._mlp(self.top, z, False)


def loss_of(logits, labels):
    if logits.dtype != torch.float64:
        logits = logits.float()
    return F.binary_cross_entropy_with_logits(logits.view(-1), labels.to(logits.dtype), reduction="mean")


# ---- optimizers, as uvmrec's (lua/uvmrec/optim, engine/src/tbe_plan.h) ----

def dense_optimizer(model, o):
    ps = [model.names[n] for n in model.dense_names]
    kind = o["name"]
    if kind == "sgd":
        return torch.optim.SGD(ps, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                               weight_decay=o["weight_decay"])
    if kind == "adagrad":
        return torch.optim.Adagrad(ps, lr=o["lr"], eps=o["eps"], weight_decay=o["weight_decay"])
    if kind in ("adam", "adamw"):
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        return cls(ps, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=o["weight_decay"])
    fail(f"dense optimizer {kind}: expected sgd, adagrad, adam or adamw")


class TableOptimizer:
    """The tables' step on their deduplicated gradient: each distinct row once."""

    def __init__(self, model, o):
        self.o, self.model, self.step_count = o, model, 0
        self.lr = o["lr"]
        if o["name"] not in ("sgd", "rowwise_adagrad", "adagrad", "adam"):
            fail(f"table optimizer {o['name']}: expected sgd, rowwise_adagrad, adagrad or adam")
        self.state = []
        for e in model.emb:
            w = e.weight
            if o["name"] == "rowwise_adagrad":
                self.state.append([torch.zeros(w.shape[0], device=w.device)])
            elif o["name"] == "adagrad":
                self.state.append([torch.zeros_like(w)])
            elif o["name"] == "adam":
                self.state.append([torch.zeros_like(w), torch.zeros_like(w)])
            else:
                self.state.append([])

    @torch.no_grad()
    def step(self):
        o, lr = self.o, self.lr
        self.step_count += 1
        for e, st in zip(self.model.emb, self.state):
            w = e.weight
            if w.grad is None:
                continue
            g = w.grad.coalesce()
            rows, g = g.indices()[0], g.values()
            if o["weight_decay"]:
                g = g + o["weight_decay"] * w[rows]
            kind = o["name"]
            if kind == "sgd":
                w.index_add_(0, rows, g, alpha=-lr)
            elif kind == "rowwise_adagrad":
                s = st[0].index_add_(0, rows, (g * g).mean(1))[rows]
                w.index_add_(0, rows, -(lr * g) / (s.sqrt() + o["eps"]).unsqueeze(1))
            elif kind == "adagrad":
                s = st[0].index_add_(0, rows, g * g)[rows]
                w.index_add_(0, rows, -(lr * g) / (s.sqrt() + o["eps"]))
            else:
                b1, b2 = o["beta1"], o["beta2"]
                m = st[0][rows] * b1 + (1 - b1) * g
                v = st[1][rows] * b2 + (1 - b2) * g * g
                st[0][rows], st[1][rows] = m, v
                mh, vh = m / (1 - b1 ** self.step_count), v / (1 - b2 ** self.step_count)
                w.index_add_(0, rows, -(lr * mh) / (vh.sqrt() + o["eps"]))
            w.grad = None


def schedule(s):
    """The learning-rate factor of step (1-based), as uvmrec.optim.schedule."""
    name = s["name"]
    if name == "constant":
        return lambda step: 1.0
    w = max(s["warmup_steps"], 1)

    def warm(step):
        return step / w if step < w else 1.0
    if name == "warmup":
        return warm
    start, steps, power, lo = s["decay_start"], s["decay_steps"], s.get("power", 2), s.get("min_factor") or 0
    last = max(lo, (1 / steps) ** power)

    def dlrm(step):
        if step < w:
            return warm(step)
        if step < start:
            return 1.0
        if step >= start + steps:
            return last
        return max(lo, ((start + steps - step) / steps) ** power)
    return dlrm


# ---- parity ----

# Relative error in the L2 norm, |uvmrec - torch| / |torch|, by precision.  f32: only the order of
# sums differs (measured about 1e-7 on small models).  bf16: one rounding is 2^-8 = 3.9e-3
# relative; uvmrec and this model round at the same points (measured: forward equal, gradients
# within 2.5e-3 on the CPU), so a few roundings' worth is allowed.  The batch and the tables' row
# sets must be equal.  A quantity outside its tolerance still passes when uvmrec is as close to
# the exact answer as PyTorch is: its error against the same model in float64 (PyTorch, from the
# same f32 weights) at most ARBITER times PyTorch's own.  Deep backward passes cancel: at the
# MLPerf shapes PyTorch's f32 gradients of the tables are 1e-3 away from float64's, so two f32
# engines cannot agree to 1e-4 there, and the float64 answer says which is right.
TOLERANCES = {
    "f32": {"batch": 0.0, "pooled": 1e-6, "inter": 1e-5, "logits": 1e-5, "loss": 1e-6, "dense": 1e-4,
            "sparse": 1e-4},
    "tf32": {"batch": 0.0, "pooled": 1e-6, "inter": 5e-3, "logits": 1e-2, "loss": 1e-3, "dense": 3e-2,
             "sparse": 3e-2},
    "bf16": {"batch": 0.0, "pooled": 4e-3, "inter": 1e-2, "logits": 1e-2, "loss": 2e-3, "dense": 2e-2,
             "sparse": 2e-2},
}
ARBITER = 2.0


def set_precision(precision, device):
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def parity(a):
    device = torch.device(a.device)
    tensors, meta = read_safetensors(a.ckpt)
    d = description(meta, a.ckpt)
    dump, dmeta = read_safetensors(a.dump)
    dd = description(dmeta, a.dump)
    for k in ("bottom", "top", "rows", "interaction", "precision", "dim", "pooling"):
        if d[k] != dd[k]:
            fail(f"{a.dump}: {k} is {dd[k]} but {a.ckpt} says {d[k]}: not the same model")
    set_precision(d["precision"], device)
    torch.manual_seed(0)
    model = DLRM(d, device)
    model.load(tensors, a.ckpt)
    # The arbiter: the same model and weights in float64.
    exact = DLRM(dict(d, precision="f32"), device)
    exact.load(tensors, a.ckpt)
    exact = exact.double()
    exact.act = torch.float64
    del tensors
    B = dump["batch.labels"].shape[0]
    first = int(dmeta.get("parity.first", "0"))
    days = DayFiles(a.data, d["rows"])
    dense_np, labels_np, sparse_np = days.read(first, B)
    if labels_np.shape[0] != B:
        fail(f"{a.data}: {labels_np.shape[0]} samples from sample {first}; the dump's batch has {B}")

    rows = []
    tols = TOLERANCES[d["precision"]]

    def rel_err(x, y):
        return float((x - y).norm() / max(float(y.norm()), 1e-30))

    def record(what, kind, got, ref, ref64=None, note=""):
        got, ref = got.double().cpu(), ref.double().cpu()
        r = {"quantity": what, "kind": kind, "shape": list(got.shape), "tol": tols[kind], "max_abs": float("nan"),
             "rel": float("nan"), "e_uvmrec": None, "e_torch": None, "ok": False, "by": "", "note": note}
        rows.append(r)
        if got.shape != ref.shape:
            r["note"] = f"shape {list(got.shape)} vs {list(ref.shape)}"
            return
        diff = got - ref
        r["max_abs"] = float(diff.abs().max()) if diff.numel() else 0.0
        r["rel"] = rel_err(got, ref)
        if ref64 is not None:
            ref64 = ref64.double().cpu()
            r["e_uvmrec"], r["e_torch"] = rel_err(got, ref64), rel_err(ref, ref64)
        if r["rel"] <= r["tol"]:
            r["ok"], r["by"] = True, "tol"
        elif r["e_uvmrec"] is not None and r["e_uvmrec"] <= ARBITER * r["e_torch"]:
            r["ok"], r["by"] = True, "f64"

    # The batch: the day files as read here against the batch uvmrec trained on.
    offs, vals, base = [], [], 0
    for v, o in sparse_np:
        offs.append(o + base)
        vals.append(v)
        base += len(v)
    offs.append(np.array([base]))
    record("batch.dense", "batch", torch.from_numpy(dense_np), dump["batch.dense"])
    record("batch.labels", "batch", torch.from_numpy(labels_np), dump["batch.labels"])
    record("batch.values", "batch", torch.from_numpy(np.concatenate(vals)), dump["batch.values"])
    record("batch.offsets", "batch", torch.from_numpy(np.concatenate(offs)), dump["batch.offsets"])

    dense, labels, sparse = to_device((dense_np, labels_np, sparse_np), device)

    def step(m):
        keep = {}
        logits = m(dense, sparse, keep)
        loss = loss_of(logits, labels)
        for t in keep.values():
            t.retain_grad()
        loss.backward()
        return logits.detach(), loss.detach().view(-1), keep

    logits, loss, keep = step(model)
    logits64, loss64, keep64 = step(exact)
    record("pooled", "pooled", dump["pooled"], keep["pooled"].detach(), keep64["pooled"].detach())
    record("inter", "inter", dump["inter"], keep["inter"].detach(), keep64["inter"].detach())
    record("logits", "logits", dump["logits"], logits, logits64)
    record("loss", "loss", dump["loss"].view(-1), loss, loss64)
    for name in model.dense_names:
        g = dump.get("grad." + name)
        if g is None:
            fail(f"{a.dump}: no grad.{name}")
        record("grad." + name, "dense", g, model.names[name].grad, exact.names[name].grad)
    for name, e, e64 in zip(d["tables"], model.emb, exact.emb):
        g, g64 = e.weight.grad.coalesce(), e64.weight.grad.coalesce()
        r_ref = g.indices()[0]
        r_got = dump.get(f"sparse.{name}.rows")
        if r_got is None:
            r_got, g_got = torch.zeros(0, dtype=torch.int64), torch.zeros(0, d["dim"])
        else:
            g_got = dump[f"sparse.{name}.grad"]
        if r_got.shape != r_ref.shape or not torch.equal(r_got, r_ref.cpu()):
            rows.append({"quantity": f"sparse.{name}.rows", "kind": "batch", "shape": list(r_got.shape), "tol": 0.0,
                         "max_abs": float("nan"), "rel": float("nan"), "e_uvmrec": None, "e_torch": None,
                         "ok": False, "by": "", "note": f"{r_got.numel()} rows vs {r_ref.numel()}"})
            continue
        record(f"sparse.{name}", "sparse", g_got, g.values(), g64.values())

    dev = dmeta.get("parity.device", "?")
    print(f"parity: {d['name']} {d['interaction']} {d['precision']}, batch {B}: uvmrec on {dev} against PyTorch "
          f"{torch.__version__} on {device.type} (and PyTorch in float64, the arbiter: ok by f64 means uvmrec's error "
          f"against it is at most {ARBITER:g}x PyTorch's)")
    print(f"{'quantity':24} {'shape':>13} {'max |diff|':>10} {'rel diff':>9} {'tol':>7} {'uvmrec-f64':>10} "
          f"{'torch-f64':>10}  ok")
    sp = [r for r in rows if r["kind"] == "sparse"]
    worst = max(sp, key=lambda r: r["rel"])["quantity"] if sp else None

    def num(v):
        return "" if v is None else f"{v:.3g}"
    for r in rows:
        # Tables: the one furthest from PyTorch and every failure, not 26 lines.
        if r["kind"] == "sparse" and r["ok"] and r["quantity"] != worst:
            continue
        print(f"{r['quantity']:24} {'x'.join(map(str, r['shape'])):>13} {r['max_abs']:10.3g} {r['rel']:9.3g} "
              f"{r['tol']:7.2g} {num(r['e_uvmrec']):>10} {num(r['e_torch']):>10}  "
              f"{('ok' + (' (f64)' if r['by'] == 'f64' else '')) if r['ok'] else 'FAIL'} {r['note']}")
    print(f"({len(sp)} tables' gradients: rows equal in {len(sp)}; the furthest shown; "
          f"{sum(r['shape'][0] for r in sp)} distinct rows)")
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, bench="torch_parity", model=d["name"], interaction=d["interaction"],
                                        precision=d["precision"], uvmrec_device=dev, torch_device=device.type,
                                        batch=B)) + "\n")
    failures = [r["quantity"] for r in rows if not r["ok"]]
    if failures:
        print(f"parity: FAILED: {', '.join(failures[:8])}{' ...' if len(failures) > 8 else ''}")
        sys.exit(1)
    by64 = sum(r["by"] == "f64" for r in rows)
    print(f"parity: ok ({len(rows)} quantities: {len(rows) - by64} within tolerance of PyTorch, {by64} as close to "
          f"float64 as PyTorch)")


# ---- training ----

def auc_exact(p, y):
    """Mann-Whitney AUC, ties counting half."""
    p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], y[order]
    _, start, counts = np.unique(ps, return_index=True, return_counts=True)
    ranks = np.repeat(start + (counts + 1) / 2.0, counts)  # 1-based average ranks
    P = ys.sum()
    N = len(ys) - P
    if P == 0 or N == 0:
        return 0.5
    return float((np.sum(ranks * ys) - P * (P + 1) / 2) / (P * N))


def evaluate(model, days, limit, batch, device):
    preds, labels = [], []
    seen = 0
    with torch.no_grad():
        while seen < days.total and (limit <= 0 or seen < limit):
            dense, lab, sparse = to_device(days.read(seen, batch), device)
            preds.append(torch.sigmoid(model(dense, sparse).float().view(-1)).cpu().numpy())
            labels.append(lab.cpu().numpy())
            seen += lab.shape[0]
    p, y = np.concatenate(preds), np.concatenate(labels)
    eps = 1e-7
    q = np.clip(p.astype(np.float64), eps, 1 - eps)
    logloss = float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))
    return {"auc": auc_exact(p, y), "logloss": logloss, "samples": int(len(y))}


def train(a):
    device = torch.device(a.device)
    tensors, meta = read_safetensors(a.ckpt)
    d = description(meta, a.ckpt)
    set_precision(d["precision"], device)
    torch.manual_seed(0)
    model = DLRM(d, device)
    model.load(tensors, a.ckpt)
    del tensors
    data = DayFiles(a.data, d["rows"])
    held = DayFiles(a.eval_data, d["rows"]) if a.eval_data else None
    B = d["batch_size"]
    steps = a.steps or -(-data.total // B)
    opt = dense_optimizer(model, d["dense_optim"])
    topt = TableOptimizer(model, d["emb_optim"])
    factor = schedule(d["schedule"])
    base_lr, base_emb = d["dense_optim"]["lr"], d["emb_optim"]["lr"]
    log_every = a.log_every or d["log_every"]
    out = open(a.out, "w") if a.out else None

    def line(obj):
        if out:
            out.write(json.dumps(obj) + "\n")
            out.flush()
    line({"event": "start", "engine": "torch", "version": torch.__version__, "device": device.type,
          "model": d["name"], "steps": steps, "batch": B})
    t0 = time.time()
    samples, loss, logged = 0, None, True
    for step in range(1, steps + 1):
        first = (step - 1) * B
        if first >= data.total:
            break
        dense, labels, sparse = to_device(data.read(first, B), device)
        f = factor(step)
        for g in opt.param_groups:
            g["lr"] = base_lr * f
        topt.lr = base_emb * f
        loss = loss_of(model(dense, sparse), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        topt.step()
        samples += labels.shape[0]
        logged = step % log_every == 0
        if logged:
            v = float(loss.detach())
            line({"event": "train", "step": step, "samples": samples, "loss": v, "seconds": time.time() - t0})
            if not math.isfinite(v):
                fail(f"the loss is {v} at step {step}", 1)
    if not logged:
        line({"event": "train", "step": step, "samples": samples, "loss": float(loss.detach()), "seconds": time.time() - t0})
    seconds = time.time() - t0
    res = {"event": "final", "engine": "torch", "steps": step, "samples": samples, "seconds": seconds,
           "samples_per_s": samples / max(seconds, 1e-9), "loss": float(loss.detach())}
    if held:
        ev = evaluate(model, held, d["eval_samples"], d["eval_batch_size"], device)
        res.update(ev)
        line(dict(ev, event="eval", step=step))
    line(res)
    print(f"torch_dlrm train: {d['name']} on {device.type}: {step} steps, {samples} samples in {seconds:.1f} s "
          f"({res['samples_per_s']:.0f} samples/s); final loss {res['loss']:.4f}"
          + (f"; AUC {res['auc']:.4f} on {res['samples']} held-out samples" if held else ""))


# ---- speed ----

def ceilings(device):
    out = {}
    n = 8192
    for p in ("f32", "tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        dt = torch.bfloat16 if p == "bf16" else torch.float32
        x = torch.randn(n, n, device=device, dtype=dt)
        y = torch.randn(n, n, device=device, dtype=dt)
        for _ in range(2):
            x @ y
        ms = time_it(lambda: x @ y, 5)
        out["mm_" + p + "_tflops"] = 2 * n ** 3 / (ms * 1e-3) / 1e12
        del x, y
    a = torch.empty(1 << 29, device=device)  # 2 GiB
    b = torch.empty_like(a)
    b.copy_(a)
    ms = time_it(lambda: b.copy_(a), 10)
    out["copy_gbps"] = 2 * a.numel() * 4 / (ms * 1e-3) / 1e9
    return out


def time_it(fn, runs):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def speed(a):
    device = torch.device(a.device)
    if a.desc:
        d = json.load(open(a.desc))
    else:
        d = description(read_safetensors(a.ckpt, names=set())[1], a.ckpt)
    if a.precision:
        d["precision"] = a.precision
    set_precision(d["precision"], device)
    B = a.batch or d["batch_size"]
    torch.manual_seed(0)
    model = DLRM(d, device, init=True)  # random weights: the time does not depend on them
    data = DayFiles(a.data, d["rows"])
    nb = max(1, min(a.batches, data.total // B))
    batches = [to_device(data.read(i * B, B), device) for i in range(nb)]
    opt = dense_optimizer(model, d["dense_optim"])
    topt = TableOptimizer(model, d["emb_optim"])
    losses = []
    # The learning rates follow the schedule, as uvmrec's side does (MLPerf's lr 24 needs its warmup).
    factor = schedule(d["schedule"])
    base_lr, base_emb = d["dense_optim"]["lr"], d["emb_optim"]["lr"]

    def step(i):
        f = factor(i + 1)
        for g in opt.param_groups:
            g["lr"] = base_lr * f
        topt.lr = base_emb * f
        dense, labels, sparse = batches[i % nb]
        loss = loss_of(model(dense, sparse), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        topt.step()
        return loss

    for i in range(a.warmup):
        losses.append(step(i))
    cuda = device.type == "cuda"
    times = []
    for i in range(a.steps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            losses.append(step(a.warmup + i))
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        else:
            t = time.perf_counter()
            float(step(a.warmup + i).detach())
            times.append((time.perf_counter() - t) * 1e3)
    lv = [float(x) for x in losses]
    if not all(math.isfinite(v) for v in lv):
        fail(f"speed: the loss is not finite: {lv[-3:]}", 1)
    ms = statistics.median(times)
    rate = B / (ms * 1e-3)
    rec = {"bench": "torch_dlrm", "model": d["name"], "precision": d["precision"], "batch": B, "device": device.type,
           "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "ms": ms,
           "samples_per_s": rate, "steps": a.steps, "batches": nb, "loss_first": lv[0], "loss_last": lv[-1]}
    print(f"torch_dlrm speed: {d['name']} {d['precision']} batch {B} on {rec['gpu']}: {ms:.3f} ms a step "
          f"(median of {a.steps}), {rate / 1e6:.3f} M samples/s; loss {lv[0]:.4f} -> {lv[-1]:.4f}")
    recs = [rec]
    if a.ceilings and cuda:
        del batches, model, opt, topt
        torch.cuda.empty_cache()
        c = ceilings(device)
        recs.append(dict(c, bench="ceilings", gpu=rec["gpu"]))
        print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in c.items()))
    if a.out:
        with open(a.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = sub.add_parser("parity")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out")
    t = sub.add_parser("train")
    t.add_argument("--ckpt", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--eval-data")
    t.add_argument("--steps", type=int, default=0)
    t.add_argument("--log-every", type=int, default=0)
    t.add_argument("--out")
    s = sub.add_parser("speed")
    s.add_argument("--desc")
    s.add_argument("--ckpt")
    s.add_argument("--data", required=True)
    s.add_argument("--precision", choices=["f32", "tf32", "bf16"])
    s.add_argument("--batch", type=int, default=0)
    s.add_argument("--batches", type=int, default=8)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--ceilings", action="store_true")
    s.add_argument("--out")
    for q in (p, t, s):
        q.add_argument("--device", choices=["cpu", "cuda"], default=default_device)
        q.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: PyTorch sees no GPU")
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.mode == "speed" and not (a.desc or a.ckpt):
        fail("speed needs --desc FILE or --ckpt FILE")
    {"parity": parity, "train": train, "speed": speed}[a.mode](a)


if __name__ == "__main__":
    main()
