-- Plain float64 references for the embedding collection specs: random batches, pooled forward,
-- per-row gradients and each optimizer's formula, written from the definitions and nothing of
-- the engine's.
local ffi = require "ffi"
local ur = require "uvmrec"

local M = {}

local ctypes = { i64 = "int64_t[?]", f32 = "float[?]", i32 = "int32_t[?]" }

-- A 1-D tensor from a Lua list, in one write.
function M.tensor(list, dtype, placement)
  local t = assert(ur.tensor({ #list }, { dtype = dtype, placement = placement or "host" }))
  if #list > 0 then
    local buf = ffi.new(ctypes[dtype], #list)
    for i, v in ipairs(list) do buf[i - 1] = v end
    if placement == "device" then
      local h = assert(ur.tensor({ #list }, { dtype = dtype }))
      assert(ur.C.ur_tensor_write(h.p, 0, #list, buf) == 0)
      assert(t:copy(h))
    else
      assert(ur.C.ur_tensor_write(t.p, 0, #list, buf) == 0)
    end
  end
  return t
end

-- A random size for a bag: empty, one, a few, and now and then many.
local function bag_size(big)
  local r = math.random()
  if r < 0.12 then return 0 end
  if r < 0.4 then return 1 end
  if big and r > 0.995 then return big end
  return math.random(2, 9)
end

-- A batch for features whose tables have rows_of[f] rows: { values, offsets, weights, lengths,
-- batch, strides } as Lua lists.  opts: batch, weighted, big (a bag size used now and then),
-- strides (per-feature batches: VBE), force = { [bag] = size }, hot = {row, count} (one bag of
-- `count` copies of `row` in feature 1).
function M.batch(rows_of, opts)
  local nf = #rows_of
  local values, offsets, weights = {}, { 0 }, opts.weighted and {} or nil
  local bag = 0
  for f = 1, nf do
    local nb = opts.strides and opts.strides[f] or opts.batch
    for b = 1, nb do
      bag = bag + 1
      local size = opts.force and opts.force[bag] or bag_size(opts.big)
      if opts.hot and f == 1 and b == 1 then size = opts.hot[2] end
      for _ = 1, size do
        local id = math.random(0, rows_of[f] - 1)
        if opts.hot and f == 1 and b == 1 then id = opts.hot[1] end
        values[#values + 1] = id
        if weights then weights[#weights + 1] = math.random() * 2 - 1 end
      end
      offsets[#offsets + 1] = #values
    end
  end
  return { values = values, offsets = offsets, weights = weights, strides = opts.strides,
           batch = opts.batch }
end

-- The batch as tensors in `placement` (the table form the collections take).
function M.input(b, placement)
  local inp = { values = M.tensor(b.values, "i64", placement), offsets = M.tensor(b.offsets, "i64", placement) }
  if b.weights then inp.weights = M.tensor(b.weights, "f32", placement) end
  if b.strides then
    inp.stride_per_key_per_rank = {}
    for f, n in ipairs(b.strides) do inp.stride_per_key_per_rank[f] = { n } end
  end
  if b.inverse_indices then inp.inverse_indices = M.tensor(b.inverse_indices, "i64", placement) end
  return inp
end

-- Every table's values as float64 lists, by name.
function M.snapshot(c)
  local out = {}
  for _, name in ipairs(c.table_names) do out[name] = c:table(name):totable() end
  return out
end

-- The collection's layout: per feature its table name, dim, column, pooling.
function M.layout(c, poolings)
  local l = {}
  for f, name in ipairs(c.features) do
    local tname = c.table_names[ur.C.ur_tbe_feature_table(c.h.p, f - 1) + 1]
    l[f] = { table = tname, dim = c.dims[tname], col = c.pooled and c:feature_col(name) or 0,
             pooling = poolings and poolings[tname] or "sum", rows = c.rows[tname] }
  end
  return l
end

-- Per bag: feature, sample, first and last value (1-based, inclusive).
local function bags(b, nf)
  local out, bag = {}, 0
  for f = 1, nf do
    local nb = b.strides and b.strides[f] or b.batch
    for s = 0, nb - 1 do
      bag = bag + 1
      out[bag] = { f = f, s = s, first = b.offsets[bag] + 1, last = b.offsets[bag + 1] }
    end
  end
  return out
end
M.bags = bags

-- Each table's row count of a collection, in layout order.
function M.rows_of(c)
  local r = {}
  for f, L in ipairs(M.layout(c.tbe or c)) do r[f] = L.rows end
  return r
end

-- Where each feature's bags start in a flat VBE output (b.strides: bags per feature), and where
-- bag g's row of the output starts: in the flat VBE output, or at its column of sample g.s.
local function flat_bases(b, layout)
  local base, acc = {}, 0
  for f = 1, #layout do
    base[f] = acc
    acc = acc + (b.strides and b.strides[f] or 0) * layout[f].dim
  end
  return base
end

local function bag_base(b, flat_base, g, L, out_dim)
  return b.strides and (flat_base[g.f] + g.s * L.dim) or (g.s * out_dim + L.col)
end

-- Pooled forward in float64: a list of rows, flat as the output's elements (out_dim per row),
-- with per element the sum of |terms| for tolerances.  Flat VBE when b.strides without inverse_indices.
function M.forward(b, layout, tables, out_dim)
  local out, mag = {}, {}
  local nf = #layout
  local flat_base = flat_bases(b, layout)
  for _, g in ipairs(bags(b, nf)) do
    local L = layout[g.f]
    local tv = tables[L.table]
    local len = g.last - g.first + 1
    local base = bag_base(b, flat_base, g, L, out_dim)
    for k = 0, L.dim - 1 do
      local sum, abs = 0, 0
      for i = g.first, g.last do
        local id = b.values[i]
        if id >= 0 and id < L.rows then
          local w = b.weights and b.weights[i] or 1
          local term = w * tv[id * L.dim + k + 1]
          sum, abs = sum + term, abs + math.abs(term)
        end
      end
      if L.pooling == "mean" and len > 0 then sum, abs = sum / len, abs / len end
      out[base + k + 1], mag[base + k + 1] = sum, abs
    end
  end
  return out, mag
end

-- The full batch from VBE bags: sample s of feature f reads bag inverse_indices[(f-1)*B + s + 1].
function M.expand(flat, b, layout, out_dim, full)
  local out = {}
  local flat_base = flat_bases(b, layout)
  for f, L in ipairs(layout) do
    for s = 0, full - 1 do
      local j = b.inverse_indices[(f - 1) * full + s + 1]
      for k = 0, L.dim - 1 do out[s * out_dim + L.col + k + 1] = flat[flat_base[f] + j * L.dim + k + 1] end
    end
  end
  return out
end

-- Per table, per row id: the float64 gradient of the loss sum(out .* grad), from the bags'
-- gradient rows (grad as a flat list in the output's layout, as M.forward's).
function M.row_grads(b, layout, grad, out_dim)
  local g = {}
  local nf = #layout
  local flat_base = flat_bases(b, layout)
  for _, bg in ipairs(bags(b, nf)) do
    local L = layout[bg.f]
    g[L.table] = g[L.table] or {}
    local len = bg.last - bg.first + 1
    local base = bag_base(b, flat_base, bg, L, out_dim)
    for i = bg.first, bg.last do
      local id = b.values[i]
      if id >= 0 and id < L.rows then
        local c = b.weights and b.weights[i] or 1
        if L.pooling == "mean" then c = c / len end
        local row = g[L.table][id] or {}
        for k = 0, L.dim - 1 do row[k + 1] = (row[k + 1] or 0) + c * grad[base + k + 1] end
        g[L.table][id] = row
      end
    end
  end
  return g
end

-- One optimizer step on a row, float64: w, g, state lists; returns the new w and state.
-- hp: lr, eps, weight_decay, max_grad, beta1, beta2, step; kind as the collection names it.
-- Rowwise Adagrad of a column shard: hp.row_sum, the whole row's sum of squared gradients, and
-- hp.row_dim, its columns, replace the shard's own.
function M.step(kind, hp, w, g, s1, s2)
  local dim = #w
  local gg = {}
  for k = 1, dim do
    local x = g[k]
    if (hp.max_grad or 0) > 0 then x = math.max(-hp.max_grad, math.min(hp.max_grad, x)) end
    gg[k] = x + (hp.weight_decay or 0) * w[k]
  end
  local nw, n1, n2 = {}, {}, {}
  if kind == "sgd" then
    for k = 1, dim do nw[k] = w[k] - hp.lr * gg[k] end
  elseif kind == "rowwise_adagrad" then
    local sq = 0
    for k = 1, dim do sq = sq + gg[k] * gg[k] end
    if hp.row_sum then sq = hp.row_sum end
    n1[1] = s1[1] + sq / (hp.row_dim or dim)
    for k = 1, dim do nw[k] = w[k] - hp.lr * gg[k] / (math.sqrt(n1[1]) + hp.eps) end
  elseif kind == "adagrad" then
    for k = 1, dim do
      n1[k] = s1[k] + gg[k] * gg[k]
      nw[k] = w[k] - hp.lr * gg[k] / (math.sqrt(n1[k]) + hp.eps)
    end
  else
    local b1, b2 = hp.beta1, hp.beta2
    for k = 1, dim do
      n1[k] = b1 * s1[k] + (1 - b1) * gg[k]
      n2[k] = b2 * s2[k] + (1 - b2) * gg[k] * gg[k]
      local mh, vh = n1[k] / (1 - b1 ^ hp.step), n2[k] / (1 - b2 ^ hp.step)
      nw[k] = w[k] - hp.lr * mh / (math.sqrt(vh) + hp.eps)
    end
  end
  return nw, n1, n2
end

-- Per row id of a table: the float64 sum of the squared gradient rowwise Adagrad's step takes
-- (clipped to hp.max_grad, plus hp.weight_decay times the row w(r) gives).
function M.row_sq(rows, hp, w)
  local out = {}
  for r, g in pairs(rows) do
    local row, sq = w(r), 0
    for k = 1, #g do
      local x = g[k]
      if (hp.max_grad or 0) > 0 then x = math.max(-hp.max_grad, math.min(hp.max_grad, x)) end
      x = x + (hp.weight_decay or 0) * row[k]
      sq = sq + x * x
    end
    out[r] = sq
  end
  return out
end

-- A flat list of n random numbers in [-1, 1).
function M.randoms(n)
  local t = {}
  for i = 1, n do t[i] = math.random() * 2 - 1 end
  return t
end

-- n training batches (math.randomseed(8) first) of 16 samples over `tables`, one feature a table
-- named as it: 1 to 3 ids a bag, each id(k, t) for batch k and table t, and a random gradient of
-- the pooled output ({sparse = KJT, grad = [16, sum of dims] f32}).
function M.train_batches(n, tables, placement, id)
  math.randomseed(8)
  local keys, width = {}, 0
  for i, t in ipairs(tables) do keys[i], width = t.name, width + t.dim end
  local list = {}
  for k = 1, n do
    local values, offsets = {}, { 0 }
    for _, t in ipairs(tables) do
      for _ = 1, 16 do
        for _ = 1, math.random(1, 3) do values[#values + 1] = id(k, t) end
        offsets[#offsets + 1] = #values
      end
    end
    local g = M.tensor(M.randoms(16 * width), "f32", placement):view_as(0, { 16, width })
    list[k] = { sparse = M.kjt({ values = values, offsets = offsets }, keys, placement), grad = g }
  end
  return list
end

-- Asserts |a[i] - b[i]| <= rel * scale[i] + abs for every i (scale defaults to |b[i]|).
function M.close(a, b, rel, abs, what, scale)
  assert(#a == #b, ("%s: %d values, expected %d"):format(what, #a, #b))
  for i = 1, #b do
    local s = scale and scale[i] or math.abs(b[i])
    local d = math.abs(a[i] - b[i])
    if d > rel * s + abs or d ~= d then
      error(("%s: element %d is %.9g, expected %.9g (off by %.3g)"):format(what, i - 1, a[i], b[i], d), 2)
    end
  end
end

-- Fails unless tensors a and b (any placement) hold the same bits, element by element (the
-- first difference named by index and value).
function M.bits_equal(a, b, what)
  a = a:placement() == "host" and a or assert(a:to("host"))
  b = b:placement() == "host" and b or assert(b:to("host"))
  if a:dtype() ~= b:dtype() or a:numel() ~= b:numel() then
    error(("%s: %s [%d] against %s [%d]"):format(what, a:dtype(), a:numel(), b:dtype(), b:numel()), 2)
  end
  local esize = a:numel() > 0 and a:nbytes() / a:numel() or 1
  local ctype = ({ [1] = "const uint8_t *", [2] = "const uint16_t *", [4] = "const uint32_t *",
                   [8] = "const uint64_t *" })[esize]
  local pa = ffi.cast(ctype, ur.C.ur_tensor_data(a.p))
  local pb = ffi.cast(ctype, ur.C.ur_tensor_data(b.p))
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then
      error(("%s: element %d is %.9g, expected %.9g"):format(what, i, a:get(i), b:get(i)), 2)
    end
  end
end

-- Batches {sparse =, grad =} through the plain loop (forward, backward): the outputs, on the host.
function M.train_plain(m, list)
  local outs = {}
  for k, b in ipairs(list) do
    outs[k] = assert(m:forward(b.sparse):to("host"))
    m:backward(b.sparse, b.grad)
  end
  return outs
end

-- A batch's table form as a KJT of `keys` (a collection's features) in `placement`.
function M.kjt(b, keys, placement)
  local lengths = {}
  for i = 1, #b.offsets - 1 do lengths[i] = b.offsets[i + 1] - b.offsets[i] end
  local o = { keys = keys, values = M.tensor(b.values, "i64", placement), lengths = M.tensor(lengths, "i32", placement),
              weights = b.weights and M.tensor(b.weights, "f32", placement) }
  if b.strides then
    o.stride_per_key_per_rank = {}
    for f, n in ipairs(b.strides) do o.stride_per_key_per_rank[f] = { n } end
    o.inverse_indices = M.tensor(b.inverse_indices, "i64", placement)
  else
    o.stride = (#b.offsets - 1) / #keys
  end
  return assert(ur.KJT(o))
end

-- The same through uvmrec.pipeline.Prefetch (opts: drain, steps, pages), batches {sparse = a
-- KJT in host or pinned memory, grad =} handed to it as uvmrec.data.Batch copies: the outputs,
-- the batches trained and the pipeline's stats.
function M.train_piped(m, list, opts)
  opts = opts or {}
  local Batch = require "uvmrec.data.batch"
  local copies = {}
  for k, b in ipairs(list) do
    copies[k] = Batch.new { sparse = assert(b.sparse:to(b.sparse:placement())), size = b.sparse:stride() }
  end
  local outs, n = {}, 0
  local p = require("uvmrec.pipeline.Prefetch").new { collection = m, source = require("uvmrec.train.source").ring(
    copies, #copies), steps = opts.steps, drain = opts.drain, pages = opts.pages }
  while true do
    local b = p:next()
    if not b then break end
    n = n + 1
    local out = assert(m:forward(b.sparse, b.ticket))
    outs[n] = assert(out:to("host"))
    m:backward(b.sparse, assert(list[n].grad:to(out:placement())), b.ticket)
  end
  p:close()
  local stats = p:stats()
  p:free()
  for _, b in ipairs(copies) do b:release() end
  return outs, n, stats
end

return M
