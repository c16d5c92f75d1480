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

Two variants of the same model: plain (the class DLRM: one nn.EmbeddingBag a table, sparse
gradients coalesced and stepped table by table, eager) and expert (ExpertDLRM and ExpertTrainer:
written for speed on one GPU as a PyTorch expert would, see "the expert variant" below).

    python3 scripts/bench/torch_dlrm.py parity --ckpt W --dump G --data DIR [--device cpu|cuda]
          [--variant plain|expert] [--compile MODE]
        compares the step uvmrec wrote (scripts/bench/parity.lua) with this model's on the same
        weights and batch: outputs, loss, every dense gradient and the deduplicated gradient of
        every table (its rows exactly, its values within a tolerance); prints a table, exit 1 on
        a mismatch.
    python3 scripts/bench/torch_dlrm.py train --ckpt W --data DIR --eval-data DIR --steps N --out F
        trains with the checkpoint's optimizers and schedule on the day files in order (no
        shuffle: uvmrec's loader with shuffle_window 0 gives the same batches), writes the loss
        every log_every steps and the final exact AUC as JSON lines.
    python3 scripts/bench/torch_dlrm.py speed --desc D.json --data DIR --precision P --out F
          [--variant both|plain|expert] [--expert-configs MODE[:graph|:nograph],...]
        samples/s of whole training steps on --batches batches read once and kept on the device
        (as uvmrec's side), rotating, the rates following the schedule: --warmup steps, then
        --steps back to back, the median step (CUDA events between steps on a GPU).  both (the
        default): the plain variant, then the expert one in each configuration asked
        (torch.compile mode and whether the step is one CUDA graph; default default:graph on a
        GPU, or $TORCH_DLRM_EXPERT_CONFIGS), each in a process of its own after a check that
        its step equals the plain one's (--no-check skips it); the line the faster variant
        writes is bench torch_dlrm, the others torch_dlrm_variant.  --ceilings also measures the
        GPU's matrix-product and copy ceilings.
"""
import argparse
import copy
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
    return modelled(d, path)


def modelled(d, path):
    """d, where this model does all it asks; else a failure naming the setting (a comparison
    against a model that leaves a setting out would be against another training)."""
    if d["emb_optim"].get("max_grad", 0):
        fail(f"{path}: embeddings.optimizer.max_grad {d['emb_optim']['max_grad']}: the PyTorch model does not "
             "clip the tables' gradients; compare with max_grad 0")
    return d


def clipped(opt, ps, o):
    """opt, its gradients clipped by their global norm before each step where the description's
    dense optimizer has clip_norm (uvmrec's optimizer.clip_norm): clip_grad_norm_, no host wait."""
    if o.get("clip_norm", 0) > 0:
        def clip(*_):
            # a step pre-hook returns None (or new arguments): clip_grad_norm_'s norm is not one
            torch.nn.utils.clip_grad_norm_(ps, o["clip_norm"])
        opt.register_step_pre_hook(clip)
    return opt


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


def dot_pairs(tables, self_interaction, device):
    """The (i, j) index pairs DLRM's dot interaction keeps of the pairwise dot products of the
    bottom output and the tables' pooled rows: the lower triangle, i-major, the diagonal too
    with self_interaction."""
    n = tables + 1
    extra = 1 if self_interaction else 0
    li = torch.tensor([i for i in range(n) for j in range(i + extra)], device=device)
    lj = torch.tensor([j for i in range(n) for j in range(i + extra)], device=device)
    return li, lj


def dot_interaction(x, e, li, lj):
    """DLRM's dot interaction of the bottom output x [B, D] and the pooled rows e [B, T * D]:
    x beside the dot products at dot_pairs' (li, lj)."""
    B = x.shape[0]
    T = torch.cat([x, e], 1).view(B, -1, x.shape[1])
    Z = torch.bmm(T, T.transpose(1, 2))
    return torch.cat([x, Z[:, li, lj]], 1)


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
            self.li, self.lj = dot_pairs(len(d["rows"]), d["self_interaction"], device)
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

    def _mlp(self, layers, x, last_relu, keep=None):
        """keep (float64 only): keep["margin"] [B] receives each sample's nearest approach to a
        ReLU's kink, |pre-activation| over the sum of its terms' magnitudes, the least over
        these layers and any recorded before."""
        a = self.act
        for i, lin in enumerate(layers):
            w, b = lin.weight.to(a), lin.bias.to(a)
            y = F.linear(x, w, b)
            if i < len(layers) - 1 or last_relu:
                if keep is not None and a == torch.float64:
                    with torch.no_grad():
                        terms = F.linear(x.detach().abs(), w.detach().abs(), b.detach().abs())
                        m = (y.detach().abs() / terms.clamp_min(1e-300)).min(1).values
                        keep["margin"] = m if "margin" not in keep else torch.minimum(keep["margin"], m)
                y = torch.relu(y)
            x = y
        return x

    def forward(self, dense, sparse, keep=None):
        """Logits [B, 1] in the activation dtype; keep: a dict that receives the pooled
        embeddings and the interaction's output."""
        a = self.act
        x = self._mlp(self.bottom, dense.to(a), True, keep)
        pooled = torch.cat([e(v, o) for e, (v, o) in zip(self.emb, sparse)], 1)
        e = pooled.to(a)
        if self.d["interaction"] == "dot":
            z = dot_interaction(x, e, self.li, self.lj)
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
        return self._mlp(self.top, z, False, keep)


def loss_of(logits, labels):
    if logits.dtype != torch.float64:
        logits = logits.float()
    return F.binary_cross_entropy_with_logits(logits.view(-1), labels.to(logits.dtype), reduction="mean")


# ---- optimizers, as uvmrec's (lua/uvmrec/optim, engine/src/embedding/tbe_plan.h) ----

def dense_optimizer(model, o):
    ps = [model.names[n] for n in model.dense_names]
    return clipped(unclipped_optimizer(ps, o), ps, o)


def unclipped_optimizer(ps, o):
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


# ---- the expert variant: the same model written for speed ----
#
# What DLRM needs from PyTorch to run fast on one GPU, as NVIDIA's PyTorch DLRM and FBGEMM's
# table-batched embeddings do it, in plain PyTorch (no torchrec, no fbgemm):
#   * one table: all tables' rows in one f32 tensor, each table at its row offset, so a batch's
#     lookups are one gather (one-hot bags) or one embedding_bag (multi-hot), and the update one
#     scatter;
#   * no sparse gradient objects: the table takes no gradient; the pooled embeddings' gradient
#     (_Lookup) is applied to the rows by hand after the backward.  SGD adds -lr * g of every id
#     into its row with atomics (index_add_), which is w[row] -= lr * (the sum of the row's
#     gradients), uvmrec's rule, without sorting or coalescing; the other optimizers (and SGD
#     with weight decay) need each row once, so the ids are deduplicated through a row -> slot
#     map (no sort) and the rows stepped as TableOptimizer steps them;
#   * the lookup and the dense part (bottom MLP, interaction, top MLP, loss) under one
#     torch.compile, bf16 by autocast, the one-hot gather fused into the cast and concatenation
#     of the interaction's input, the dot interaction as a bmm (its backward one bmm, _SelfDot)
#     and a gather of the lower triangle, the top MLP's input padded to a multiple of 8 columns
#     (a zero column with a zero weight column: the same model, aligned rows for the tensor
#     cores);
#   * fused SGD (foreach for the other optimizers) for the dense parameters;
#   * on a GPU, the whole step (lookup, forward, backward, both updates) captured as one CUDA
#     graph and replayed, the batch copied into the graph's input buffers first.

class _Lookup(torch.autograd.Function):
    """The pooled embeddings [B, T, D] (f32) of the ids idx (rows of the table w; one-hot bags
    when offsets is None, else embedding_bag's bags).  The table takes no gradient: the
    gradient, times the 0-dim tensor s (-lr for atomic SGD: a tensor, so a CUDA graph follows
    the schedule), goes to sink, a placeholder of the output's shape that nothing reads, where
    the tables' update finds it.  Inside torch.compile the gather of one-hot bags fuses into the
    kernel that casts and concatenates the rows (no f32 copy of them), and the scaled gradient
    is written by the kernel that splits the interaction's gradient."""

    @staticmethod
    def forward(ctx, w, idx, offsets, sink, s, mode):
        ctx.save_for_backward(s)
        if offsets is None:
            return w.index_select(0, idx).view(sink.shape)
        return F.embedding_bag(idx, w, offsets, mode=mode, include_last_offset=True).view(sink.shape)

    @staticmethod
    def backward(ctx, g):
        (s,) = ctx.saved_tensors
        return None, None, None, g * s, None, None


class _SelfDot(torch.autograd.Function):
    """Z = v v^T for each sample, v [B, n, D]; the backward as one product, (dZ + dZ^T) v,
    where autograd's bmm would take two and add them."""

    @staticmethod
    def forward(ctx, v):
        ctx.save_for_backward(v)
        return torch.bmm(v, v.transpose(1, 2))

    @staticmethod
    def backward(ctx, g):
        (v,) = ctx.saved_tensors
        return torch.bmm(g + g.transpose(1, 2), v)


class ExpertDLRM(torch.nn.Module):
    """DLRM as DLRM above, one concatenated table (plus one scratch row at the end, never looked
    up, that padded slots of the deduplicated update point at)."""

    def __init__(self, d, device, init=False):
        super().__init__()
        self.d, self.device = d, device
        self.act = torch.bfloat16 if d["precision"] == "bf16" else torch.float32
        self.rows = list(d["rows"])
        self.T, self.D = len(self.rows), d["dim"]
        self.row_offsets = np.concatenate([[0], np.cumsum(self.rows)]).astype(np.int64)
        self.total = int(self.row_offsets[-1])
        self.weight = torch.empty(self.total + 1, self.D, device=device)
        with torch.no_grad():
            self.weight[self.total].zero_()
            if init:
                for t, r in enumerate(self.rows):
                    o = int(self.row_offsets[t])
                    self.weight[o:o + r].uniform_(-1 / math.sqrt(r), 1 / math.sqrt(r))
        self.names = {}  # uvmrec's names -> (parameter, the plain model's shape)

        def mlp(prefix, sizes, pad_first=0):
            ps = torch.nn.ParameterList()
            for i in range(len(sizes) - 1):
                lin = torch.nn.Linear(sizes[i], sizes[i + 1], device=device)
                w = lin.weight
                if i == 0 and pad_first:
                    w = torch.nn.Parameter(torch.cat([w.detach(), torch.zeros(sizes[1], pad_first, device=device)], 1))
                ps.append(w)
                ps.append(lin.bias)
                self.names[f"{prefix}.{2 * i + 1}.weight"] = (w, (sizes[i + 1], sizes[i]))
                self.names[f"{prefix}.{2 * i + 1}.bias"] = (lin.bias, (sizes[i + 1],))
            return ps

        self.dot = d["interaction"] == "dot"
        width = d["top"][0]
        self.pad = (-width) % 8 if self.dot else 0
        self.bottom = mlp("bottom", d["bottom"])
        self.top = mlp("top", d["top"], self.pad)
        self.cross = torch.nn.ParameterList()
        if self.dot:
            n = self.T + 1
            extra = 1 if d["self_interaction"] else 0
            self.tri = torch.tensor([i * n + j for i in range(n) for j in range(i + extra)], device=device)
        else:
            cw = d["bottom"][-1] + self.T * self.D
            r = d["cross_rank"]
            for layer in range(1, d["cross_layers"] + 1):
                shapes = [("V", (r, cw)), ("U", (cw, r))] if r > 0 else [("weight", (cw, cw))]
                for kind, shape in shapes + [("bias", (cw,))]:
                    p = torch.nn.Parameter(torch.randn(shape, device=device) / math.sqrt(cw))
                    self.cross.append(p)
                    self.names[f"interaction.{kind}_{layer}"] = (p, shape)
        self.dense_names = list(self.names)

    def params(self):
        return [p for p, _ in self.names.values()]

    @torch.no_grad()
    def load_from(self, dense, tables):
        """dense: {uvmrec name: tensor of the plain model's shape}; tables: one tensor a table."""
        for name, (p, shape) in self.names.items():
            t = dense[name]
            if tuple(t.shape) != tuple(shape):
                fail(f"{name} is {list(t.shape)}; this model's is {list(shape)}")
            p.zero_()
            p[tuple(slice(0, s) for s in shape)].copy_(t.float())
        for t, (w, r) in enumerate(zip(tables, self.rows)):
            if tuple(w.shape) != (r, self.D):
                fail(f"table {t} is {list(w.shape)}; expected [{r}, {self.D}]")
            o = int(self.row_offsets[t])
            self.weight[o:o + r].copy_(w.float())

    def dense_grad(self, name):
        p, shape = self.names[name]
        return p.grad[tuple(slice(0, s) for s in shape)]

    def forward(self, w, dense, idx, offsets, sink, labels, scale):
        """The step's forward from the lookup to the loss: loss (f32), logits [B, 1], the top
        MLP's input [B, width] (without the padding) and the pooled embeddings in the
        activations' type [B, T * D], from the table w (self.weight: an argument, so that
        torch.compile reads it as an input, not a constant).  After the backward, sink.grad holds the pooled
        embeddings' gradient times scale."""
        e = _Lookup.apply(w, idx, offsets, sink, scale, self.d["pooling"])
        with torch.autocast(dense.device.type, dtype=torch.bfloat16, enabled=self.act == torch.bfloat16):
            x = dense
            for i in range(0, len(self.bottom), 2):
                x = torch.relu(F.linear(x, self.bottom[i], self.bottom[i + 1]))
            a = x.dtype
            B = x.shape[0]
            if self.dot:
                v = torch.cat([x.unsqueeze(1), e.to(a)], 1)
                pooled = v[:, 1:].flatten(1)
                Z = _SelfDot.apply(v).to(a)
                parts = [x, Z.flatten(1).index_select(1, self.tri)]
                if self.pad:
                    parts.append(torch.zeros(B, self.pad, dtype=a, device=x.device))
                z = torch.cat(parts, 1)
            else:
                x0 = torch.cat([x, e.flatten(1).to(a)], 1)
                pooled = x0[:, x.shape[1]:]
                xl = x0
                ps = list(self.cross)
                per = 3 if self.d["cross_rank"] > 0 else 2
                for layer in range(self.d["cross_layers"]):
                    q = ps[layer * per:(layer + 1) * per]
                    h = F.linear(F.linear(xl, q[0]), q[1], q[2]) if per == 3 else F.linear(xl, q[0], q[1])
                    if a == torch.bfloat16:
                        xl = (x0.float() * h.float() + xl.float()).to(a)
                    else:
                        xl = x0 * h + xl
                z = xl
            y = z
            nt = len(self.top) // 2
            for i in range(nt):
                y = F.linear(y, self.top[2 * i], self.top[2 * i + 1])
                if i < nt - 1:
                    y = torch.relu(y)
        loss = F.binary_cross_entropy_with_logits(y.float().view(-1), labels, reduction="mean")
        return loss, y, z[:, :z.shape[1] - self.pad], pooled


class ExpertBatch:
    """A batch as the expert variant reads it, on the device: dense [B, 13] f32, labels [B] f32,
    idx the ids as rows of the concatenated table, sample-major (bag b*T + t).  One-hot (every bag
    one id): idx is [B*T] and the gradient's rows line up with it.  Multi-hot: bag_offsets
    [B*T + 1] and, per id, its bag and (mean pooling) 1/length."""

    def __init__(self, batch, model, device):
        dense, labels, sparse = batch
        B, T = labels.shape[0], len(sparse)
        off = model.row_offsets
        lengths = np.stack([np.diff(np.append(o, len(v))) for v, o in sparse], 1)
        self.B, self.T = B, T
        self.dense = torch.from_numpy(dense).to(device)
        self.labels = torch.from_numpy(labels).to(device)
        self.onehot = bool((lengths == 1).all())
        if self.onehot:
            idx = np.stack([v + off[t] for t, (v, o) in enumerate(sparse)], 1).reshape(-1)
            self.idx = torch.from_numpy(idx).to(device)
            self.bag_offsets = self.bag = self.inv_len = None
            return
        bag = np.concatenate([np.repeat(np.arange(B, dtype=np.int64) * T + t, lengths[:, t]) for t in range(T)])
        vals = np.concatenate([v + off[t] for t, (v, o) in enumerate(sparse)])
        order = np.argsort(bag, kind="stable")
        self.idx = torch.from_numpy(vals[order]).to(device)
        self.bag = torch.from_numpy(bag[order]).to(device)
        flat = lengths.reshape(-1)
        self.bag_offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(flat)]).astype(np.int64)).to(device)
        self.inv_len = torch.from_numpy((1.0 / np.maximum(flat, 1)).astype(np.float32)).to(device)[self.bag]

    def tensors(self):
        return [t for t in (self.dense, self.labels, self.idx, self.bag_offsets, self.bag, self.inv_len)
                if t is not None]

    def clone(self):
        c = copy.copy(self)
        for k in ("dense", "labels", "idx", "bag_offsets", "bag", "inv_len"):
            if getattr(self, k) is not None:
                setattr(c, k, getattr(self, k).clone())
        return c


class ExpertTrainer:
    """The expert variant's training step: lookup, the compiled dense part, backward, the tables'
    update and the dense optimizer, with the learning rates in 0-dim device tensors (so a CUDA
    graph of the step follows the schedule)."""

    def __init__(self, model, d, compile_mode="default"):
        self.m, self.d = model, d
        dev = model.device
        self.do, self.eo = d["dense_optim"], d["emb_optim"]
        self.pooling = d["pooling"]
        self.emb_lr = torch.tensor(float(self.eo["lr"]), device=dev)
        self.scale = torch.tensor(1.0, device=dev)  # multiplies the tables' gradient
        kind = self.eo["name"]
        if kind not in ("sgd", "rowwise_adagrad", "adagrad", "adam"):
            fail(f"table optimizer {kind}: expected sgd, rowwise_adagrad, adagrad or adam")
        self.atomic = kind == "sgd" and not self.eo["weight_decay"]
        R = model.total + 1
        self.state = {"rowwise_adagrad": lambda: [torch.zeros(R, device=dev)],
                      "adagrad": lambda: [torch.zeros(R, model.D, device=dev)],
                      "adam": lambda: [torch.zeros(R, model.D, device=dev), torch.zeros(R, model.D, device=dev)],
                      "sgd": lambda: []}[kind]()
        # The row -> slot map of the deduplication: every entry the step reads it wrote first
        # in the same step, so it is never cleared.
        self.slot = None if self.atomic else torch.zeros(R, dtype=torch.int64, device=dev)
        self.step_count = 0
        self.sink = None  # the placeholder that receives the pooled embeddings' gradient
        self.opt = self._dense_optimizer(model.params())
        self.fn = model.forward if compile_mode == "none" else torch.compile(model.forward, mode=compile_mode,
                                                                              dynamic=False, fullgraph=True)
        # torch.compile's own CUDA graphs copy every input that is not a parameter into a
        # static buffer before each replay: the table and the placeholder are static.
        self.static = compile_mode in ("reduce-overhead", "max-autotune")
        if self.static:
            torch._dynamo.mark_static_address(model.weight)
        # A CUDA graph bakes Python numbers in: only optimizers whose state and rates are tensors.
        self.graphable = (dev.type == "cuda" and kind in ("sgd", "rowwise_adagrad", "adagrad")
                          and self.do["name"] == "sgd")

    def reset(self):
        """The optimizers' state as new."""
        for t in self.state:
            t.zero_()
        self.step_count = 0
        self.opt = self._dense_optimizer(self.m.params())

    def _dense_optimizer(self, ps):
        ps = list(ps)
        return clipped(self._unclipped(ps), ps, self.do)

    def _unclipped(self, ps):
        o, kind = self.do, self.do["name"]
        cuda = self.m.device.type == "cuda"
        if kind == "sgd":
            # The rate a device tensor: a graph replay reads the schedule's value.
            lr = torch.tensor(float(o["lr"]), device=self.m.device)
            return torch.optim.SGD(ps, lr=lr, momentum=o["momentum"], nesterov=o["nesterov"],
                                   weight_decay=o["weight_decay"], fused=True)
        if kind == "adagrad":
            # Adagrad's fused implementation is the CPU's only.
            return torch.optim.Adagrad(ps, lr=o["lr"], eps=o["eps"], weight_decay=o["weight_decay"],
                                       foreach=cuda, fused=not cuda)
        if kind in ("adam", "adamw"):
            cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
            return cls(ps, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=o["weight_decay"],
                       fused=True)
        fail(f"dense optimizer {kind}: expected sgd, adagrad, adam or adamw")

    def set_lr(self, dense_lr, emb_lr):
        """Outside a graph: the rates of the next step (device tensors, no synchronisation)."""
        self.emb_lr.fill_(emb_lr)
        self.scale.fill_(-emb_lr if self.atomic else 1.0)
        for g in self.opt.param_groups:
            if torch.is_tensor(g["lr"]):
                g["lr"].fill_(dense_lr)
            else:
                g["lr"] = dense_lr

    def forward_backward(self, b):
        """Forward and backward: loss, logits, the interaction's output, the pooled embeddings
        and their gradient times self.scale [B, T, D] f32; the dense gradients in .grad."""
        if self.sink is None or self.sink.shape != (b.B, b.T, self.m.D):
            self.sink = torch.empty(b.B, b.T, self.m.D, device=self.m.device, requires_grad=True)
            if self.static:
                torch._dynamo.mark_static_address(self.sink)
        self.sink.grad = None
        loss, logits, z, pooled = self.fn(self.m.weight, b.dense, b.idx, b.bag_offsets, self.sink, b.labels,
                                          self.scale)
        loss.backward()
        return loss, logits, z, pooled, self.sink.grad

    def id_grads(self, b, g):
        """The gradient of each id, [nnz, D], from the pooled gradient g [B, T, D]."""
        g = g.view(-1, self.m.D)
        if b.onehot:
            return g
        g = g.index_select(0, b.bag)
        return g * b.inv_len.unsqueeze(1) if self.pooling == "mean" else g

    @torch.no_grad()
    def dedup(self, idx, src):
        """(rows, gsum): each distinct row of idx once with the sum of its ids' gradients, in
        static shapes (no synchronisation, graph-safe): nnz slots, the unused ones pointing at the
        scratch row with a zero gradient."""
        n = idx.numel()
        pos = torch.arange(n, device=idx.device)
        self.slot.index_put_((idx,), pos)  # one id of each row wins its slot
        s = self.slot.index_select(0, idx)
        gsum = torch.zeros(n, src.shape[1], device=src.device).index_add_(0, s, src)
        rows = torch.where(s == pos, idx, torch.full_like(idx, self.m.total))
        return rows, gsum

    @torch.no_grad()
    def update_tables(self, b, g):
        w, o, kind = self.m.weight, self.eo, self.eo["name"]
        src = self.id_grads(b, g)
        if self.atomic:
            w.index_add_(0, b.idx, src)  # src is -lr * gradient already
            return
        rows, g = self.dedup(b.idx, src)
        lr = self.emb_lr
        if o["weight_decay"]:
            g = g + o["weight_decay"] * w.index_select(0, rows)
        st = self.state
        if kind == "sgd":
            w.index_add_(0, rows, g * -lr)
        elif kind == "rowwise_adagrad":
            # The scratch row may take 0/eps or 0/0: it is never read.
            st[0].index_add_(0, rows, (g * g).mean(1))
            w.index_add_(0, rows, g * (-lr / (st[0].index_select(0, rows).sqrt() + o["eps"])).unsqueeze(1))
        elif kind == "adagrad":
            st[0].index_add_(0, rows, g * g)
            w.index_add_(0, rows, g * -lr / (st[0].index_select(0, rows).sqrt() + o["eps"]))
        else:
            b1, b2 = o["beta1"], o["beta2"]
            m = st[0].index_select(0, rows) * b1 + (1 - b1) * g
            v = st[1].index_select(0, rows) * b2 + (1 - b2) * g * g
            st[0].index_copy_(0, rows, m)
            st[1].index_copy_(0, rows, v)
            mh, vh = m / (1 - b1 ** self.step_count), v / (1 - b2 ** self.step_count)
            w.index_add_(0, rows, -lr * mh / (vh.sqrt() + o["eps"]))

    def step(self, b, keep=None):
        """One training step on the batch b; the loss (a 0-dim tensor, not waited for); keep:
        a dict that receives the logits."""
        self.step_count += 1
        # Before the backward, not after the step: inside a CUDA graph the gradients must be
        # allocated by the captured backward, and stay.
        self.opt.zero_grad(set_to_none=True)
        loss, logits, _, _, g = self.forward_backward(b)
        self.update_tables(b, g)
        self.opt.step()
        if keep is not None:
            keep["logits"] = logits.detach()
        return loss.detach()


class GraphedStep:
    """The expert's whole step as one CUDA graph: warm-up steps on a side stream, capture, then
    per step the batch copied into the graph's input buffers and a replay."""

    def __init__(self, trainer, batch, warmup):
        self.tr = trainer
        self.static = batch = batch.clone()
        self.bufs = batch.tensors()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                trainer.step(batch)
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        trainer.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.loss = trainer.step(batch)

    def step(self, b):
        for dst, src in zip(self.bufs, b.tensors()):
            dst.copy_(src)
        self.graph.replay()
        return self.loss.clone()


def rounding(before, adds=None):
    """How far two f32 updates of the weights before may differ by rounding alone: 2 eps |w|
    (each rounds each weight once), or eps sqrt(k + 4) |w| for a row of k atomic adds (each of
    an id's -lr * g into the weight rounds there; k roundings of w add up to about
    0.3 sqrt(k) eps |w|)."""
    eps = torch.finfo(torch.float32).eps
    sq = before.double().pow(2).sum(-1) if before.dim() > 1 else before.double().pow(2)
    k = 4.0 if adds is None else adds.double() + 4
    return eps * float((sq * k).sum().sqrt())


def same_step(tr, b, run_a, run_b, what):
    """Whether run_b(b) steps the model as run_a(b) does from the same state (a CUDA graph's
    replay against the eager step it captured): the loss within 1e-4 and the update of every
    dense parameter and of the batch's rows within 1e-3 of the update plus their rounding
    (atomics add in another order, a product may take another algorithm; a wrong input, row or
    rate is off by the update's own size).  Leaves the model stepped once, by run_b."""
    rows, adds = torch.unique(b.idx, return_counts=True)
    ps = tr.m.params()
    ostate = [t for st in tr.opt.state.values() for t in st.values() if torch.is_tensor(t)]

    def snap():
        return ([p.detach().clone() for p in ps], tr.m.weight[rows].clone(),
                [st[rows].clone() for st in tr.state], [t.clone() for t in ostate])

    def put(sn):
        with torch.no_grad():
            for p, q in zip(ps, sn[0]):
                p.copy_(q)
            tr.m.weight[rows] = sn[1]
            for st, q in zip(tr.state, sn[2]):
                st[rows] = q
            for t, q in zip(ostate, sn[3]):
                t.copy_(q)

    s0 = snap()
    loss_a = run_a(b).float()
    sa = snap()
    put(s0)
    loss_b = run_b(b).float()
    sb = snap()
    worst, ok = 0.0, bool(torch.allclose(loss_a, loss_b, rtol=1e-4, atol=0))
    floors = [rounding(x0) for x0 in s0[0]] + [rounding(s0[1], adds if tr.atomic else None)]
    for xa, xb, x0, floor in zip(sa[0] + [sa[1]], sb[0] + [sb[1]], s0[0] + [s0[1]], floors):
        da, db = (xa - x0).double(), (xb - x0).double()
        e = float((da - db).norm())
        ref = float(da.norm())
        ok = ok and e <= 1e-3 * ref + floor
        worst = max(worst, e / max(ref, 1e-30))
    print(f"check: {what}: loss {float(loss_a):.6f} / {float(loss_b):.6f}, updates within {worst:.3g}: "
          f"{'ok' if ok else 'FAILED'}")
    return ok


def expert_from_plain(plain, d, device):
    """An expert model with the plain model's weights."""
    m = ExpertDLRM(d, device)
    m.load_from({n: p.detach() for n, p in plain.names.items()}, [e.weight.detach() for e in plain.emb])
    return m


def check_expert(d, device, batch_np, compile_mode):
    """One step of the plain and the expert variants from the same weights on one batch, at the
    base learning rates: the logits, the loss and every parameter's update (the tables' on the
    rows the batch read, and no other row moved) must agree within TOLERANCES, or the expert
    must be as close to the step in float64 as the plain variant is.  Updates, not weights: a
    wrong row, sign or scale is an error of the update's own size.  The floor of each
    comparison is the f32 rounding of the stored weights (rounding(): the tables stepped by
    atomic SGD round once per id of a row, where the plain variant adds the row's summed
    gradient once).  Returns the expert
    trainer (weights and optimizer state put back as they were) and whether the check passed."""
    tols = TOLERANCES[d["precision"]]
    torch.manual_seed(0)
    plain = DLRM(d, device, init=True)
    ex = expert_from_plain(plain, d, device)
    tr = ExpertTrainer(ex, d, compile_mode)
    w0 = ex.weight.detach().clone()
    dense0 = {n: p.detach().clone() for n, p in plain.names.items()}
    lr, elr = d["dense_optim"]["lr"], d["emb_optim"]["lr"]

    dense, labels, sparse = to_device(batch_np, device)
    opt = dense_optimizer(plain, d["dense_optim"])
    topt = TableOptimizer(plain, d["emb_optim"])
    logits_p = plain(dense, sparse)
    loss_p = loss_of(logits_p, labels)
    opt.zero_grad(set_to_none=True)
    loss_p.backward()
    opt.step()
    topt.step()

    eb = ExpertBatch(batch_np, ex, device)
    tr.set_lr(lr, elr)
    keep = {}
    loss_e = tr.step(eb, keep)
    logits_e = keep["logits"]

    uc = [torch.unique(torch.from_numpy(v).to(device), return_counts=True) for v, _ in batch_np[2]]
    rows_t = [r for r, _ in uc]
    qs = []  # (what, kind, expert, plain, before or None, rounding floor)
    qs.append(("logits", "logits", logits_e.detach().float(), logits_p.detach().float(), None, 0.0))
    qs.append(("loss", "loss", loss_e.detach().view(1), loss_p.detach().float().view(1), None, 0.0))
    for n, p in plain.names.items():
        pe = ex.names[n][0].detach()[tuple(slice(0, s) for s in p.shape)]
        qs.append(("update " + n, "dense", pe - dense0[n], p.detach() - dense0[n], dense0[n], rounding(dense0[n])))
    for t, ((r, k), emb) in enumerate(zip(uc, plain.emb)):
        o = int(ex.row_offsets[t])
        before = w0[o + r]
        qs.append((f"update {d['tables'][t]}", "sparse", ex.weight[o + r] - before, emb.weight.detach()[r] - before,
                   before, rounding(before, k if tr.atomic else None)))
    moved = (ex.weight != w0).any(1)
    touched = torch.zeros_like(moved)
    touched[ex.total] = True  # the scratch row
    for t, r in enumerate(rows_t):
        touched[int(ex.row_offsets[t]) + r] = True
    stray = int((moved & ~touched).sum())

    def err(x, y):
        return float((x.double() - y.double()).norm())

    results, failed = [], []
    for what, kind, xe, xp, before, floor in qs:
        ref = float(xp.double().norm())
        e_ = err(xe, xp)
        ok = e_ <= tols[kind] * ref + floor
        results.append([what, kind, e_ / max(ref, 1e-30), tols[kind], floor / max(ref, 1e-30), ok, ""])
        if not ok:
            failed.append(len(results) - 1)
    if failed:
        # The arbiter: the plain model in float64 from the same weights, one step.
        exact = DLRM(dict(d, precision="f32"), device)
        exact.load({"dense." + n: t for n, t in dense0.items()}
                   | {f"embeddings.{name}": w0[int(ex.row_offsets[t]):int(ex.row_offsets[t + 1])]
                      for t, name in enumerate(d["tables"])}, "the check")
        exact = exact.double()
        exact.act = torch.float64
        opt64 = dense_optimizer(exact, d["dense_optim"])
        topt64 = TableOptimizer(exact, d["emb_optim"])
        logits64 = exact(dense.double(), sparse)
        loss64 = loss_of(logits64, labels)
        loss64.backward()
        opt64.step()
        topt64.step()
        for i in failed:
            what, kind, xe, xp, before, floor = qs[i]
            if what == "logits":
                x64 = logits64.detach()
            elif what == "loss":
                x64 = loss64.detach().view(1)
            elif kind == "dense":
                n = what[len("update "):]
                x64 = exact.names[n].detach() - dense0[n].double()
            else:
                t = d["tables"].index(what[len("update "):])
                x64 = exact.emb[t].weight.detach()[rows_t[t]] - before.double()
            ee, ep = err(xe, x64), err(xp, x64)
            if ee <= ARBITER * ep + floor:
                results[i][5], results[i][6] = True, f"(f64: expert {ee:.3g}, plain {ep:.3g})"
        del exact
    ok = all(r[5] for r in results) and stray == 0
    print(f"check: expert against plain, {d['name']} {d['precision']} batch {labels.shape[0]} on {device.type}, "
          f"one step at lr {lr:g} / tables {elr:g}: {len(results)} quantities")
    worst = {}
    for r in results:
        k = r[1]
        if k not in worst or r[2] / max(r[3], 1e-30) > worst[k][2] / max(worst[k][3], 1e-30):
            worst[k] = r
    for r in results:
        if r is worst.get(r[1]) or not r[5]:
            print(f"  {r[0]:28} {r[1]:7} rel {r[2]:9.3g} tol {r[3]:7.2g} (+ rounding {r[4]:.2g})  "
                  f"{'ok' if r[5] else 'FAIL'} {r[6]}")
    print(f"  rows moved outside the batch's: {stray}")
    print(f"check: {'ok' if ok else 'FAILED'}")
    # The timed steps start from the weights the check started from, not after a step at the
    # base rate (MLPerf's 24 without its warm-up diverges).
    ex.load_from(dense0, [w0[int(ex.row_offsets[t]):int(ex.row_offsets[t + 1])] for t in range(ex.T)])
    tr.reset()
    del plain, opt, topt, w0
    return tr, ok


# ---- parity ----

# Relative error in the L2 norm, |uvmrec - torch| / |torch|, by precision.  f32: only the order of
# sums differs (measured about 1e-7 on small models).  bf16: one rounding is 2^-8 = 3.9e-3
# relative; uvmrec and this model round at the same points (measured: forward equal, gradients
# within 2.5e-3 on the CPU), so a few roundings' worth is allowed.  The batch and the tables' row
# sets must be equal.  A quantity outside its tolerance still passes when uvmrec is as close to
# the exact answer as PyTorch is: its error against the same model in float64 (PyTorch, from the
# same f32 weights) at most ARBITER times PyTorch's own.  At the MLPerf shapes both f32 engines'
# gradients of the tables are 1e-3 from each other and from float64's: not the sums' roundings
# (4e-7 once the kinks are set aside) but a few ReLU units that rounding turns off in one and on
# in another (KINK), so two f32 engines cannot agree to 1e-4 there.
# "act": the per-sample gradients of the interaction's output and of the pooled embeddings,
# which the dense gradients and each table row's sum are made of, held as the dense gradients are.
TOLERANCES = {
    "f32": {"batch": 0.0, "pooled": 1e-6, "inter": 1e-5, "logits": 1e-5, "loss": 1e-6, "dense": 1e-4,
            "act": 1e-4, "sparse": 1e-4},
    "tf32": {"batch": 0.0, "pooled": 1e-6, "inter": 5e-3, "logits": 1e-2, "loss": 1e-3, "dense": 3e-2,
             "act": 3e-2, "sparse": 3e-2},
    "bf16": {"batch": 0.0, "pooled": 4e-3, "inter": 1e-2, "logits": 1e-2, "loss": 2e-3, "dense": 2e-2,
             "act": 2e-2, "sparse": 2e-2},
}
ARBITER = 2.0
# A sample is at a ReLU's kink where, in float64, some unit's pre-activation is within KINK of
# the sum of its terms' magnitudes.  At the MLPerf shape in f32 on the CPU the per-sample
# gradients are as exact (4e-7) with the band at 1e-7, 1e-6 or 1e-5 (22, 237 and 1872 of 8192
# samples set aside): the units that flipped lay within 1e-7, and 1e-6 leaves 10x.  A flip
# outside the band fails the check (it cannot pass one); the samples inside it are not held to
# float64 themselves (a fault confined to them would pass: a float64 backward that follows each
# engine's own masks would close that); a wider band checks fewer samples, and
# past KINK_MOST of the batch the check would mostly weigh each engine against itself, so the
# run fails instead.  f32 only: in TF32 and bf16 the band would take most samples, and their
# tolerances hold without it.  The dense gradients still carry the flips (within tolerance).
KINK = {"f32": 1e-6}
KINK_MOST = 0.1


def set_precision(precision, device):
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def plain_step_grads(m, dense, labels, sparse):
    """Forward and backward of the plain model without a step: what the parity compares."""
    keep = {}
    logits = m(dense, sparse, keep)
    loss = loss_of(logits, labels)
    for k in ("pooled", "inter"):
        keep[k].retain_grad()
    loss.backward()
    sp = {}
    for name, e in zip(m.d["tables"], m.emb):
        g = e.weight.grad.coalesce()
        sp[name] = (g.indices()[0], g.values())
    return {"logits": logits.detach(), "loss": loss.detach().view(-1), "pooled": keep["pooled"].detach(),
            "inter": keep["inter"].detach(), "dense": {n: p.grad for n, p in m.names.items()}, "sparse": sp,
            "pooled.grad": keep["pooled"].grad, "inter.grad": keep["inter"].grad, "margin": keep.get("margin")}


def expert_step_grads(d, tensors, path, batch_np, device, compile_mode):
    """The same from the expert variant (compiled as it is timed); the tables' gradient is
    deduplicated here, for the comparison only."""
    ex = ExpertDLRM(d, device)
    dense = {}
    for n in ex.names:
        if "dense." + n not in tensors:
            fail(f"{path}: no tensor dense.{n}")
        dense[n] = tensors["dense." + n]
    tables = []
    for name in d["tables"]:
        if "embeddings." + name not in tensors:
            fail(f"{path}: no tensor embeddings.{name}")
        tables.append(tensors["embeddings." + name])
    ex.load_from(dense, tables)
    tr = ExpertTrainer(ex, d, compile_mode)  # its gradient scale stays 1: the gradient itself
    b = ExpertBatch(batch_np, ex, device)
    loss, logits, z, pooled, ge = tr.forward_backward(b)
    rows, inv = torch.unique(b.idx, return_inverse=True)
    vals = torch.zeros(rows.numel(), ex.D, device=device).index_add_(0, inv, tr.id_grads(b, ge))
    sp = {}
    for t, name in enumerate(d["tables"]):
        lo, hi = int(ex.row_offsets[t]), int(ex.row_offsets[t + 1])
        k = (rows >= lo) & (rows < hi)
        sp[name] = (rows[k] - lo, vals[k])
    # the interaction's output gradient stays inside the compiled step: not compared
    return {"logits": logits.detach(), "loss": loss.detach().view(-1), "pooled": pooled.detach(),
            "inter": z.detach(), "dense": {n: ex.dense_grad(n) for n in ex.names}, "sparse": sp,
            "pooled.grad": ge, "inter.grad": None}


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
    B = dump["batch.labels"].shape[0]
    first = int(dmeta.get("parity.first", "0"))
    days = DayFiles(a.data, d["rows"])
    dense_np, labels_np, sparse_np = days.read(first, B)
    if labels_np.shape[0] != B:
        fail(f"{a.data}: {labels_np.shape[0]} samples from sample {first}; the dump's batch has {B}")
    dense, labels, sparse = to_device((dense_np, labels_np, sparse_np), device)
    if a.variant == "plain":
        model = DLRM(d, device)
        model.load(tensors, a.ckpt)
        got = plain_step_grads(model, dense, labels, sparse)
        del model
    else:
        got = expert_step_grads(d, tensors, a.ckpt, (dense_np, labels_np, sparse_np), device, a.compile)
    # The arbiter: the same model and weights in float64.
    exact = DLRM(dict(d, precision="f32"), device)
    exact.load(tensors, a.ckpt)
    exact = exact.double()
    exact.act = torch.float64
    del tensors
    got64 = plain_step_grads(exact, dense, labels, sparse)
    del exact

    rows = []
    tols = TOLERANCES[d["precision"]]

    def rel_err(x, y):
        return float((x - y).norm() / max(float(y.norm()), 1e-30))

    def record(what, kind, got, ref, ref64=None, note="", ref64_torch=None):
        """ref64: float64's answer, uvmrec's and PyTorch's errors are taken against (ref64_torch:
        another one for PyTorch's)."""
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
            ref64_torch = ref64 if ref64_torch is None else ref64_torch.double().cpu()
            r["e_uvmrec"], r["e_torch"] = rel_err(got, ref64), rel_err(ref, ref64_torch)
        if r["rel"] <= r["tol"]:
            r["ok"], r["by"] = True, "tol"
        elif r["e_uvmrec"] is not None and r["e_uvmrec"] <= ARBITER * r["e_torch"]:
            r["ok"], r["by"] = True, "f64"

    def kink_rows(t, name, own, rows_ref):
        """Table t's float64 gradient with an engine's own per-sample gradients (own, [B, ...])
        standing for float64's in the samples at a kink; rows in rows_ref's order."""
        D = d["dim"]
        g64s = got64["pooled.grad"].reshape(B, -1)[:, t * D:(t + 1) * D].double().cpu()
        owns = own.reshape(B, -1)[:, t * D:(t + 1) * D].double().cpu()
        per = torch.where(amb.view(-1, 1), owns, g64s)
        v, o = sparse_np[t]
        v, o = torch.from_numpy(v).long(), torch.from_numpy(o).long()  # o: each bag's start
        lens = torch.diff(o, append=torch.tensor([v.numel()]))
        bag = torch.repeat_interleave(torch.arange(B), lens)
        src = per.index_select(0, bag)
        if d["pooling"] == "mean":
            src = src / lens.index_select(0, bag).clamp_min(1).double().view(-1, 1)
        elif d["pooling"] != "sum":
            fail(f"parity: pooling {d['pooling']}: the kinks' float64 answer is written for sum and mean")
        rows, inv = torch.unique(v, return_inverse=True)
        if not torch.equal(rows, rows_ref.cpu()):
            fail(f"parity: table {name}: the batch's rows are not the gradient's")
        return torch.zeros(rows.numel(), D, dtype=torch.float64).index_add_(0, inv, src)

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

    record("pooled", "pooled", dump["pooled"], got["pooled"], got64["pooled"])
    record("inter", "inter", dump["inter"], got["inter"], got64["inter"])
    record("logits", "logits", dump["logits"], got["logits"], got64["logits"])
    record("loss", "loss", dump["loss"].view(-1), got["loss"], got64["loss"])
    # Samples at a ReLU's kink (KINK): a rounding can turn such a unit off in one engine and on
    # in float64, and its sample's gradients then differ by the whole of that unit's share, in
    # either engine by chance; one such unit in 23 M made 3e-4 of the interaction gradient's
    # error at the MLPerf shape in f32 on the CPU (scripts/bench/top_bwd_error.py shows it).  Their per-sample
    # gradients are left out of the act rows, and each engine's own stand for float64's in the
    # tables' float64 answer, so that the arbiter weighs arithmetic, not coin flips.
    kink = KINK.get(d["precision"]) if a.kink is None else a.kink
    amb = (got64["margin"] < kink).cpu() if kink is not None and got64.get("margin") is not None \
        else torch.zeros(B, dtype=torch.bool)
    keep = ~amb
    if amb.any() and "pooled.grad" not in dump:
        fail(f"{a.dump}: {int(amb.sum())} samples at a ReLU's kink, and the dump has no pooled.grad to stand for "
             f"float64's there (a dump of before 2026-12-02: write it again with parity.lua)")
    if float(amb.double().mean()) > KINK_MOST:
        fail(f"parity: {int(amb.sum())} of {B} samples at a ReLU's kink (margin < {kink:g}), over {KINK_MOST:g} "
             f"of the batch: the check would weigh the engines against themselves")
    # The per-sample gradients each table row sums (dumps of before 2026-12-02 lack them), as
    # [B, columns]: where a table gradient's distance to float64 comes from.
    for what in ("inter.grad", "pooled.grad"):
        if what in dump and got[what] is not None:
            record(what, "act", dump[what].reshape(B, -1)[keep], got[what].reshape(B, -1).cpu()[keep],
                   got64[what].reshape(B, -1).cpu()[keep],
                   note=f"({int(amb.sum())} samples at a kink left out)" if amb.any() else "")
    for name in got["dense"]:
        g = dump.get("grad." + name)
        if g is None:
            fail(f"{a.dump}: no grad.{name}")
        record("grad." + name, "dense", g, got["dense"][name], got64["dense"][name])
    for name in d["tables"]:
        (r_ref, g), (_, g64) = got["sparse"][name], got64["sparse"][name]
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
        if amb.any():
            t = d["tables"].index(name)
            ref_u = kink_rows(t, name, dump["pooled.grad"], r_ref)
            ref_t = kink_rows(t, name, got["pooled.grad"], r_ref)
            record(f"sparse.{name}", "sparse", g_got, g, ref_u, ref64_torch=ref_t)
        else:
            record(f"sparse.{name}", "sparse", g_got, g, g64)

    dev = dmeta.get("parity.device", "?")
    print(f"parity: {d['name']} {d['interaction']} {d['precision']}, batch {B}: uvmrec on {dev} against PyTorch "
          f"{torch.__version__} ({a.variant} variant) on {device.type} (and PyTorch in float64, the arbiter: ok by "
          f"f64 means uvmrec's error against it is at most {ARBITER:g}x PyTorch's)")
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
    if amb.any():
        print(f"({int(amb.sum())} of {B} samples at a ReLU's kink in float64 (margin < {kink:g}): left out of the "
              f"act rows, each engine's own gradients in the tables' float64 answer)")
    if a.out:
        with open(a.out, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, bench="torch_parity", variant=a.variant, model=d["name"],
                                        interaction=d["interaction"],
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

def auc_undefined(y):
    """Why the AUC of labels y is undefined (one class, or none), as uvmrec.metrics.auc_undefined
    words it for held-out labels; None when it is defined."""
    n, P = len(y), int(np.sum(y))
    if n == 0:
        return "no held-out label"
    if 0 < P < n:
        return None
    if n == 1:
        return f"the 1 held-out label is {P}"
    return f"all {n} held-out labels are {1 if P else 0}"


def auc_exact(p, y):
    """Mann-Whitney AUC, ties counting half; None with one class (auc_undefined says why: 0.5
    there read as a result)."""
    p, y = np.asarray(p, np.float64), np.asarray(y, np.float64)
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], y[order]
    _, start, counts = np.unique(ps, return_index=True, return_counts=True)
    ranks = np.repeat(start + (counts + 1) / 2.0, counts)  # 1-based average ranks
    P = ys.sum()
    N = len(ys) - P
    if P == 0 or N == 0:
        return None
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
    res = {"auc": auc_exact(p, y), "logloss": logloss, "samples": int(len(y))}
    why = auc_undefined(y)
    if why:
        res["auc_undefined"] = why
    return res


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
          + (f"; AUC {res['auc']:.4f} on {res['samples']} held-out samples" if held and res["auc"] is not None
             else f"; AUC undefined: {res['auc_undefined']}" if held else ""))


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
    """The median milliseconds of runs calls of fn, each between two CUDA events (also
    torch_mlp.py's timing)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def time_steps(step, first, n, cuda):
    """Milliseconds of each of n steps run back to back from step number first, and their losses.
    On a GPU an event between steps and one wait at the end (the host runs ahead as it does in
    training, as uvmrec's side is timed); on the CPU the clock, each step waited for."""
    losses, times = [], []
    if cuda:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        ev[0].record()
        for i in range(n):
            losses.append(step(first + i))
            ev[i + 1].record()
        ev[-1].synchronize()
        times = [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]
    else:
        for i in range(n):
            t = time.perf_counter()
            losses.append(step(first + i))
            float(losses[-1])
            times.append((time.perf_counter() - t) * 1e3)
    return times, losses


def speed_desc(a):
    if a.desc:
        try:
            d = json.load(open(a.desc))
        except (OSError, ValueError) as e:
            fail(f"{a.desc}: {e}")
    else:
        d = description(read_safetensors(a.ckpt, names=set())[1], a.ckpt)
    if a.precision:
        d["precision"] = a.precision
    return modelled(d, a.desc or a.ckpt)


def speed(a):
    if a.variant == "both":
        return speed_both(a)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    d = speed_desc(a)
    set_precision(d["precision"], device)
    B = a.batch or d["batch_size"]
    data = DayFiles(a.data, d["rows"])
    nb = max(1, min(a.batches, data.total // B))
    batches_np = [data.read(i * B, B) for i in range(nb)]
    # The learning rates follow the schedule, as uvmrec's side does (MLPerf's lr 24 needs its warmup).
    factor = schedule(d["schedule"])
    base_lr, base_emb = d["dense_optim"]["lr"], d["emb_optim"]["lr"]
    config, check = "-", None
    if a.variant == "plain":
        torch.manual_seed(0)
        model = DLRM(d, device, init=True)  # random weights: the time does not depend on them
        batches = [to_device(b, device) for b in batches_np]
        opt = dense_optimizer(model, d["dense_optim"])
        topt = TableOptimizer(model, d["emb_optim"])

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
            return loss.detach()
    else:
        t0 = time.time()
        if a.check:
            tr, ok = check_expert(d, device, batches_np[0], a.compile)
            if not ok:
                fail("speed: the expert variant's step is not the plain variant's; not timed", 1)
            check = "ok"
        else:
            torch.manual_seed(0)
            tr = ExpertTrainer(ExpertDLRM(d, device, init=True), d, a.compile)
        batches = [ExpertBatch(b, tr.m, device) for b in batches_np]
        graph = a.cuda_graph == "on" and cuda
        why = ("not on a GPU" if not cuda else
               "the optimizers keep Python numbers" if not tr.graphable else
               "multi-hot batches change shape" if not all(b.onehot for b in batches) else
               f"torch.compile mode {a.compile} makes graphs of its own" if a.compile in ("reduce-overhead",
                                                                                          "max-autotune") else None)
        if graph and why:
            print(f"speed: no CUDA graph of the step: {why}")
            graph = False
        runner = tr
        f = factor(1)
        tr.set_lr(base_lr * f, base_emb * f)
        if graph:
            runner = GraphedStep(tr, batches[0], 3)
            # Another rate than the capture's: a rate baked into the graph shows.
            f = factor(2)
            tr.set_lr(base_lr * f, base_emb * f)
            if a.check and not same_step(tr, batches[-1], tr.step, runner.step, "the CUDA graph's step against eager"):
                fail("speed: the CUDA graph's step is not the eager one's; not timed", 1)
        elif a.check and not cuda:
            # The comparison itself, tried where there is no graph to compare.
            same_step(tr, batches[-1], tr.step, tr.step, "eager against eager (the graph's comparison, tried)")
        config = (f"compile {a.compile}" + (", one CUDA graph" if graph else "") +
                  (", tables by atomic SGD" if tr.atomic else ", tables deduplicated"))

        def step(i):
            f = factor(i + 1)
            tr.set_lr(base_lr * f, base_emb * f)
            return runner.step(batches[i % nb])
        step(0)  # compiles
        if cuda:
            torch.cuda.synchronize()
        print(f"speed: expert ready in {time.time() - t0:.1f} s ({config})")

    _, warm = time_steps(step, 0, a.warmup, cuda)
    times, losses = time_steps(step, a.warmup, a.steps, cuda)
    lv = [float(x) for x in warm + losses]
    if not all(math.isfinite(v) for v in lv):
        fail(f"speed: the loss is not finite: {lv[-3:]}", 1)
    ms = statistics.median(times)
    rate = B / (ms * 1e-3)
    rec = {"bench": "torch_dlrm", "variant": a.variant, "config": config, "check": check, "model": d["name"],
           "precision": d["precision"], "batch": B, "device": device.type,
           "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "ms": ms,
           "ms_mean": sum(times) / len(times), "samples_per_s": rate, "steps": a.steps, "batches": nb,
           "loss_first": lv[0], "loss_last": lv[-1]}
    print(f"torch_dlrm speed: {a.variant} ({config}): {d['name']} {d['precision']} batch {B} on {rec['gpu']}: "
          f"{ms:.3f} ms a step (median of {a.steps}, mean {rec['ms_mean']:.3f}), {rate / 1e6:.3f} M samples/s; "
          f"loss {lv[0]:.4f} -> {lv[-1]:.4f}")
    recs = [rec]
    if a.ceilings and cuda:
        del batches, step
        torch.cuda.empty_cache()
        c = ceilings(device)
        recs.append(dict(c, bench="ceilings", gpu=rec["gpu"]))
        print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in c.items()))
    if a.result:
        with open(a.result, "w") as f:
            f.write(json.dumps(rec) + "\n")
    if a.out:
        with open(a.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    return rec


COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
# Tried in order when none of the configurations asked ran: without the graph, then without
# torch.compile (no Triton, say), with and without the graph.
EXPERT_FALLBACK = [("default", "off"), ("none", "on"), ("none", "off")]


def expert_configs(text, cuda):
    """'MODE:graph|nograph,...' -> [(mode, 'on'|'off')]."""
    if not text:
        return [("default", "on" if cuda else "off")]
    out = []
    for item in text.split(","):
        mode, _, g = item.partition(":")
        if mode not in COMPILE_MODES or g not in ("graph", "nograph", ""):
            fail(f"--expert-configs: {item}: expected MODE[:graph|:nograph], MODE one of {', '.join(COMPILE_MODES)}")
        out.append((mode, "on" if g == "graph" else "off"))
    return out


def speed_both(a):
    """Both variants, each in a process of its own (a failure or a CUDA error in one leaves the
    other's result), the expert in each configuration asked for (the fastest that passed its
    check counts), falling back to simpler ones when none ran.  Writes each run's line
    (bench torch_dlrm_variant) and the faster variant's as bench torch_dlrm (what
    dlrm_speed.lua compares uvmrec with)."""
    import subprocess
    import tempfile
    cuda = a.device == "cuda"
    d = speed_desc(a)
    base = [sys.executable, os.path.abspath(__file__), "speed", "--data", a.data, "--batch", str(a.batch),
            "--batches", str(a.batches), "--steps", str(a.steps), "--warmup", str(a.warmup), "--device", a.device,
            "--threads", str(a.threads)]
    base += ["--desc", a.desc] if a.desc else ["--ckpt", a.ckpt]
    if a.precision:
        base += ["--precision", a.precision]
    runs = []

    def run(extra):
        with tempfile.NamedTemporaryFile("r", suffix=".json") as res:
            cmd = base + extra + ["--result", res.name]
            print("+ " + " ".join(cmd[1:]), flush=True)
            rc = subprocess.call(cmd)
            text = res.read()
        rec = json.loads(text) if rc == 0 and text else None
        runs.append({"extra": extra, "rc": rc, "rec": rec})
        return rec

    plain = run(["--variant", "plain"])
    experts = []
    configs = expert_configs(a.expert_configs, cuda)
    for i, (mode, g) in enumerate(configs + [c for c in EXPERT_FALLBACK if c not in configs]):
        if i >= len(configs) and experts:
            break
        r = run(["--variant", "expert", "--compile", mode, "--cuda-graph", g] + ([] if a.no_check else ["--check"]))
        if r:
            experts.append(r)
    expert = min(experts, key=lambda r: r["ms"]) if experts else None
    best = min([r for r in (plain, expert) if r], key=lambda r: r["ms"], default=None)
    recs = []
    for r in runs:
        if r["rec"]:
            recs.append(dict(r["rec"], bench="torch_dlrm_variant"))
        else:
            recs.append({"bench": "torch_dlrm_variant", "variant": r["extra"][1], "failed": True, "rc": r["rc"],
                         "args": " ".join(r["extra"]), "precision": d["precision"], "model": d["name"]})
    if best:
        recs.append(dict(best, bench="torch_dlrm", plain_ms=plain and plain["ms"], expert_ms=expert and expert["ms"],
                         expert_config=expert and expert["config"]))
    print(f"\ntorch_dlrm speed, both variants: {d['name']} {d['precision']} on {best['gpu'] if best else a.device}")
    print(f"  {'variant':7} {'configuration':58} {'ms':>9} {'M/s':>8} {'check':>6}")
    for r in recs:
        if r["bench"] != "torch_dlrm_variant":
            continue
        if r.get("failed"):
            print(f"  {r['variant']:7} {r['args']:58} {'failed (exit ' + str(r['rc']) + ')':>25}")
        else:
            print(f"  {r['variant']:7} {r['config']:58} {r['ms']:9.3f} {r['samples_per_s'] / 1e6:8.3f} "
                  f"{r['check'] or '-':>6}")
    if plain and expert:
        print(f"  the expert variant is {plain['ms'] / expert['ms']:.2f}x the plain one")
    if a.ceilings and cuda:
        c = ceilings(torch.device("cuda"))
        recs.append(dict(c, bench="ceilings", gpu=torch.cuda.get_device_name()))
        print("ceilings: " + ", ".join(f"{k} {v:.1f}" for k, v in c.items()))
    if a.out:
        with open(a.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    if not expert:
        fail("speed: no configuration of the expert variant ran", 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = sub.add_parser("parity")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out")
    p.add_argument("--variant", choices=["plain", "expert"], default="plain")
    p.add_argument("--compile", choices=COMPILE_MODES, default="default")
    p.add_argument("--kink", type=float, help="the band of a ReLU's kink (default: KINK's for the precision)")
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
    s.add_argument("--variant", choices=["plain", "expert", "both"], default="both")
    s.add_argument("--compile", choices=COMPILE_MODES, default="default")
    s.add_argument("--cuda-graph", choices=["on", "off"], default="on")
    s.add_argument("--check", action="store_true")
    s.add_argument("--no-check", action="store_true")
    s.add_argument("--expert-configs", default=os.environ.get("TORCH_DLRM_EXPERT_CONFIGS"))
    s.add_argument("--result", help=argparse.SUPPRESS)
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
