-- uvmrec against PyTorch (issue 9): one training step of DLRM (dot and DCNv2, f32 and bf16)
-- written by scripts/bench/parity.lua and checked by the PyTorch DLRM of
-- scripts/bench/torch_dlrm.py on the same weights and batch: outputs, loss, every dense gradient
-- and every table's deduplicated gradient within the tolerances it states.  Needs PyTorch and
-- numpy in build/venv (make pydeps-torch) or in UVMREC_PYTHON; pending without.
local ur = require "uvmrec"
local ck = require "uvmrec.checkpoint"
local json = require "uvmrec.json"
local h = require "helpers"
local command = require "command"

local q = command.quote

-- A Python with PyTorch (on CUDA when cuda), or nil with the running spec marked pending.
local function python(cuda)
  local py = h.python(cuda and "import torch, numpy; assert torch.cuda.is_available()" or "import torch, numpy")
  if not py then
    pending(cuda and "PyTorch with CUDA is not importable (set UVMREC_PYTHON)"
            or "PyTorch is not importable (make pydeps-torch)")
  end
  return py
end

-- dlrm_tiny as it is (dot), and dlrm_dcnv2 cut down (dim 16, narrow MLPs, two cross layers of
-- rank 32, tables capped at 2000 rows) on its multi-hot data.
local CASES = {
  { name = "dot", data = "tiny", args = "--config dlrm_tiny --batch 1024" },
  { name = "dcnv2", data = "dcnv2", args = "--config dlrm_dcnv2 --batch 512 --set embeddings.max_rows=2000 "
    .. "--set embeddings.dim=16 --set model.bottom_mlp=64,16 --set model.top_mlp=64,32,1 "
    .. "--set model.cross_rank=32 --set model.cross_layers=2" },
}

describe("uvmrec against PyTorch (torch_dlrm.py parity)", function()
  local dir
  local function data(name)
    local path = dir .. "/" .. name
    if not command.slurp(path .. "/layout.txt") then
      local samples = name == "tiny" and 2048 or 1024
      local _, err, code = command.run(("scripts/datagen.lua %s --out %s --samples %d"):format(name, q(path), samples))
      assert.equal(0, code, err)
    end
    return path
  end

  setup(function() dir = command.tmpdir() end)
  teardown(function() command.rmdir(dir) end)

  -- Runs both sides; returns torch_dlrm.py's output, exit code and JSON lines, and the weights'
  -- and the dump's paths.
  local function parity(c, precision, py, opts)
    opts = opts or {}
    local tag = ("%s_%s%s"):format(c.name, precision, opts.tag or "")
    local w, g = ("%s/w_%s.safetensors"):format(dir, tag), ("%s/g_%s.safetensors"):format(dir, tag)
    local out, err, code = command.run(("scripts/bench/parity.lua %s --precision %s --data %s --ckpt %s --dump %s%s%s")
      :format(c.args, precision, q(data(c.data)), q(w), q(g), opts.gpu and "" or " --cpu", opts.extra or ""))
    assert.equal(0, code, out .. err)
    assert.matches("^parity: " .. (c.name == "dot" and "dlrm_tiny" or "dlrm_dcnv2"), out)
    local ckpt = opts.ckpt or w
    local jl = dir .. "/parity.jsonl"
    os.remove(jl)
    out, err, code = command.sh(("%s scripts/bench/torch_dlrm.py parity --ckpt %s --dump %s --data %s --device %s "
      .. "--out %s"):format(py, q(ckpt), q(g), q(data(c.data)), opts.gpu and "cuda" or "cpu", q(jl)))
    local lines = json.read_lines(jl) or {}
    return out .. err, code, lines, w, g
  end

  local function check(c, precision, out, code, lines)
    assert.equal(0, code, out)
    assert.matches("parity: ok", out)
    local kinds, tables = {}, 0
    for _, r in ipairs(lines) do
      assert.is_true(r.ok, r.quantity)
      assert.equal(precision, r.precision)
      kinds[r.kind] = (kinds[r.kind] or 0) + 1
      if r.kind == "batch" then assert.equal(0, r.rel, r.quantity) end
      if r.kind == "sparse" then tables = tables + 1 end
    end
    -- the batch (4), pooled, interaction, logits, loss, 8 or 16 dense gradients, the gradients
    -- of the interaction's output and of the pooled embeddings (act), 26 tables
    assert.equal(4, kinds.batch)
    assert.equal(2, kinds.act)
    assert.equal(1, kinds.logits)
    assert.equal(1, kinds.loss)
    assert.equal(c.name == "dot" and 8 or 16, kinds.dense)
    assert.equal(26, tables)
  end

  for _, c in ipairs(CASES) do
    for _, precision in ipairs { "f32", "bf16" } do
      it(("agrees on a %s step in %s on the CPU"):format(c.name, precision), function()
        local py = python(false)
        if not py then return end
        check(c, precision, parity(c, precision, py))
      end)

      h.cuda_it(("agrees on a %s step in %s on the GPU, PyTorch on the GPU"):format(c.name, precision), function()
        local py = python(true)
        if not py then return end
        check(c, precision, parity(c, precision, py, { gpu = true }))
      end)
    end
  end

  it("fails when the weights differ: a checkpoint of another seed against the dump", function()
    local py = python(false)
    if not py then return end
    local _, _, _, other = parity(CASES[1], "f32", py, { extra = " --set train.seed=7", tag = "_seed7" })
    local out, code, lines = parity(CASES[1], "f32", py, { ckpt = other })
    assert.equal(1, code, out)
    assert.matches("parity: FAILED: pooled, inter, logits, loss", out, 1, true)
    local bad = {}
    for _, r in ipairs(lines) do if not r.ok then bad[r.quantity] = true end end
    assert.is_true(bad.logits and bad.loss and bad["grad.top.3.weight"] and bad["sparse.C3"] and true or false)
    assert.is_nil(bad["batch.values"])
  end)

  it("fails on one table's gradient 0.1% off, the samples at a ReLU's kink set aside", function()
    local py = python(false)
    if not py then return end
    local c = CASES[1]
    local _, _, _, w, g = parity(c, "f32", py, { tag = "_scaled" })
    -- the dump again, its C2 gradient times 1.001 (loaded as copies: views would be the file's)
    local d = assert(ck.load(g, { placement = "host" }))
    local t = d.tensors["sparse.C2.grad"]
    for i = 0, t:numel() - 1 do t:set(i, t:get(i) * 1.001) end
    assert(ck.save(g, { tensors = d.tensors, meta = d.meta }))
    -- a band wide enough that dlrm_tiny has samples in it (41 of 1024 when written), so that the
    -- tables' float64 answer is the one with each engine's own gradients at the kinks
    local jl = dir .. "/scaled.jsonl"
    local out, err, code = command.sh(("%s scripts/bench/torch_dlrm.py parity --ckpt %s --dump %s --data %s "
      .. "--device cpu --kink 1e-4 --out %s"):format(py, q(w), q(g), q(data(c.data)), q(jl)))
    assert.equal(1, code, out .. err)
    assert.matches("parity: FAILED: sparse.C2$", out:gsub("\n$", ""))
    local kinks = tonumber(out:match("%((%d+) of 1024 samples at a ReLU's kink in float64 %(margin < 0.0001%)"))
    assert.is_true(kinks and kinks > 0 and kinks <= 102, out)
    -- past a tenth of the batch at a kink the run fails instead
    local out2, err2, code2 = command.sh(("%s scripts/bench/torch_dlrm.py parity --ckpt %s --dump %s --data %s "
      .. "--device cpu --kink 1e-2"):format(py, q(w), q(g), q(data(c.data))))
    assert.equal(2, code2, out2 .. err2)
    assert.matches("samples at a ReLU's kink (margin < 0.01), over 0.1 of the batch", out2 .. err2, 1, true)
    for _, r in ipairs(json.read_lines(jl)) do
      if r.quantity == "sparse.C2" then
        assert.is_true(r.e_uvmrec > 5e-4 and r.e_torch < 1e-5, out)
      else
        assert.is_true(r.ok, r.quantity)
      end
    end
  end)

  it("top_bwd_error.py: f32 with float64's ReLU masks is within roundings of float64", function()
    local py = python(false)
    if not py then return end
    local c = CASES[1]
    local _, _, _, w, g = parity(c, "f32", py, { tag = "_top" })
    local out, err, code = command.sh(("%s scripts/bench/top_bwd_error.py --ckpt %s --dump %s --device cpu")
      :format(py, q(w), q(g)))
    assert.equal(0, code, out .. err)
    local n = 0
    for e in out:gmatch("float64's masks, split%-K +%d+ +(%S+)") do
      n = n + 1
      assert.is_true(tonumber(e) < 1e-5, out)
    end
    assert.equal(5, n, out)
    assert.matches("uvmrec %(the dump%) +%d", out)
    assert.matches("ReLU masks f32 vs float64: %d+ of %d+ differ", out)
  end)

  it("names the file and the fault in a checkpoint it cannot read", function()
    local py = python(false)
    if not py then return end
    local bad = dir .. "/short.safetensors"
    command.spit(bad, "\100\0\0\0\0\0\0\0{}")
    local out, err, code = command.sh(("%s scripts/bench/torch_dlrm.py train --ckpt %s --data %s --device cpu")
      :format(py, q(bad), q(data("tiny"))))
    assert.equal(2, code, out .. err)
    assert.matches("torch_dlrm: " .. bad:gsub("%p", "%%%0") .. ": header length 100 runs past the file's 10 bytes",
                   err)
    local plain = dir .. "/plain.safetensors"
    assert(ck.save(plain, { tensors = { x = ur.tensor({ 2 }):fill(1) } }))
    out, err, code = command.sh(("%s scripts/bench/torch_dlrm.py train --ckpt %s --data %s --device cpu")
      :format(py, q(plain), q(data("tiny"))))
    assert.equal(2, code, out .. err)
    assert.matches("no uvmrec.meta.torch in the metadata", err, 1, true)
  end)
end)
