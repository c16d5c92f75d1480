-- uvmrec's side of the parity with PyTorch (scripts/bench/torch_dlrm.py parity): one training
-- step's outputs, loss and every gradient, written for the PyTorch DLRM to check.
--
--   luajit scripts/bench/parity.lua --data DIR --ckpt W.safetensors --dump G.safetensors
--          [--config dlrm_tiny] [--set k=v]... [--precision f32|tf32|bf16] [--batch B]
--          [--first N] [--cpu]   (--help)
--
-- Builds the model of the config (on the GPU when there is one, unless --cpu), saves its
-- initial weights (--ckpt: dense.<parameter> and embeddings.<table>, as the trainer's
-- checkpoints name them, with the model's description in the metadata), reads one batch of B
-- samples from sample N of the binary day files in DIR (uvmrec datagen / convert writes them;
-- ids are taken modulo each table's rows, as the trainer does), and runs forward, the loss and
-- backward, taking the tables' deduplicated gradient (ur_tbe_sparse_grad) in place of their
-- fused optimizer step and leaving the dense optimizer out.  It then checks that walk against
-- the model's own backward (the dense gradients must be the same bits), and writes --dump:
-- logits, loss, grad.<parameter>, sparse.<table>.rows / .grad, the pooled embeddings, the
-- interaction's output, their gradients (pooled.grad, inter.grad) and the batch itself.
local ur = require "uvmrec"
local train = require "uvmrec.train"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local P = dofile(here .. "/parity_lib.lua")
local options = require("uvmrec.cli").options

local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/parity.lua",
  summary = "uvmrec's side of the parity with PyTorch: one training step's outputs, loss and gradients",
  { "--data DIR", "binary day files (uvmrec datagen / convert)", required = true },
  { "--ckpt FILE", "where the initial weights go", required = true },
  { "--dump FILE", "where the step's outputs, loss, gradients and batch go", required = true },
  { "--config C", "a config or preset", default = "dlrm_tiny" },
  options.set,
  options.precision,
  options.batch_size,
  { "--first N", "the batch's first sample", type = "whole", default = 0 },
  options.cpu,
}
local o = cmd:parse(arg)
local flag_set = require("uvmrec.lib").flag_set
local things = require("uvmrec.lib").things
if o.precision then o.set[#o.set + 1] = flag_set("--precision", "model.precision", o.precision) end
if o.batch then o.set[#o.set + 1] = flag_set("--batch", "train.batch_size", o.batch) end

local gpu = ur.gpu() and not o.cpu
local cfg, def = P.config(o.config, o.set)
if not cfg then cmd:fail(def) end
local model, merr = def.build(cfg, { cpu = not gpu })
if not model then cmd:fail(merr) end
local opt = train.optimizer(cfg, model)
local desc = P.describe(cfg, model, opt)
local ok, err = P.save_weights(o.ckpt, model, desc, cfg)
if not ok then cmd:fail(err) end

-- One batch of the day files, where the model runs.
local B = cfg.train.batch_size
local loader, lerr = ur.data.loader { data = "criteo-bin:" .. o.data, batch_size = B, depth = 1,
                                      rows = desc.rows, position = { epoch = 0, sample = o.first } }
if not loader then cmd:fail(lerr) end
local b, berr = loader:next()
if not b then cmd:fail(berr or ("%s: no samples from sample %d"):format(o.data, o.first)) end
if b.size ~= B then
  cmd:fail(("%s: %s from sample %d; the batch needs %d"):format(o.data, things(b.size, "sample"), o.first, B))
end
local batch = b:to(gpu and "device" or "host")
assert(ur.sync()) -- the copies are done before the loader's buffers go
loader:close()

-- The step, the tables' gradient taken without their step.
model:zero_grad()
local list, s = P.phases(model, opt, batch, { sparse_grad = true })
P.run_phases(list)
-- The interaction's output without its padding columns (models/dlrm.lua pads a dot model's).
local inter, ginter = s.z, s.gz
if model.top.modules[1].in_width ~= model.interaction_width then
  local first = { module = model.top.modules[1], name = "weight" }
  inter, ginter = P.unpadded(first, s.z), P.unpadded(first, s.gz)
end
local out = {
  logits = P.host_f32(s.logits), loss = assert(s.loss:to("host")), pooled = P.host_f32(s.e),
  inter = P.host_f32(inter),
  -- the per-sample gradients the tables' rows sum: where a table's error comes from
  ["pooled.grad"] = P.host_f32(s.ge), ["inter.grad"] = P.host_f32(ginter),
  ["batch.dense"] = assert(batch.dense:to("host")), ["batch.labels"] = assert(batch.labels:to("host")),
  ["batch.values"] = assert(batch.sparse:values():to("host")),
  ["batch.offsets"] = assert(batch.sparse:offsets():to("host")),
}
local grads = {}
for _, p in ipairs(model:parameters()) do
  if p.grad then
    local h = assert(P.unpadded(p, p.grad):to("host"))
    out["grad." .. p.name] = h
    grads[#grads + 1] = { name = p.name, host = h, grad = p.grad, p = p }
  end
end
local unique = 0
for name, g in pairs(s.sparse) do
  out["sparse." .. name .. ".rows"] = assert(g.rows:to("host"))
  out["sparse." .. name .. ".grad"] = assert(g.grad:to("host"))
  unique = unique + g.rows:numel()
end
local loss = out.loss:get(0)

-- The walk above against the model's own backward: the same dense gradients, bit for bit on
-- the CPU; on the GPU within 1e-6 of the largest (a library may pick another product algorithm
-- the second time).
model:zero_grad()
local logits = model:forward(batch)
model:backward(batch, model.criterion:backward(logits, batch.labels))
for _, g in ipairs(grads) do
  local a, c = g.host:totable(), assert(P.unpadded(g.p, g.grad):to("host")):totable()
  local big = 0
  for i = 1, #c do big = math.max(big, math.abs(c[i])) end
  for i = 1, #a do
    if math.abs(a[i] - c[i]) > (gpu and 1e-6 * big or 0) then
      cmd:fail(("self-check: gradient %s[%d] is %.9g by the phases but %.9g by DLRM:backward"):format(g.name, i - 1,
        a[i], c[i]))
    end
  end
end

ok, err = ck.save(o.dump, { tensors = out, meta = {
  ["uvmrec.meta.torch"] = json.encode(desc), ["parity.device"] = gpu and "cuda" or "cpu",
  ["parity.first"] = tostring(o.first), ["parity.data"] = o.data } })
if not ok then cmd:fail(err) end
print(("parity: %s (%s interaction, %s) on %s: batch %d from sample %d of %s; loss %.6f; %d dense gradients, "
  .. "%d distinct rows in %s; weights %s, dump %s"):format(cfg.name, desc.interaction, desc.precision,
  gpu and "the GPU" or "the CPU", B, o.first, o.data, loss, #grads, unique, things(model.num_tables, "table"), o.ckpt,
  o.dump))
