-- uvmrec.dist.sharded: an embedding bag collection sharded over the ranks of a job, with the
-- unsharded one's forward and backward.  Each rank builds and initialises only its own shards
-- (the same numbers as the unsharded tables' rows: uvmrec.tbe's shard option), keeping each
-- table's placement; uvmrec.dist.plan says where every shard lives.
--
--   local dist = require "uvmrec.dist"
--   local ebc = dist.shard(collection, { default = "table_wise", C3 = "row_wise" })
--   local out = ebc:forward(kjt)        -- this rank's samples [B, out_dim], as the unsharded one
--   ebc:backward(kjt, grad)             -- the fused optimizer steps every shard's rows
--
-- A step, for a batch of B samples on each of W ranks (a global batch of W * B):
--   input: row-wise tables' ids are split into one bucket per rank (KJT bucketize); every rank
--     sends each rank the features its shards read: first the splits (per rank and key, the
--     counts of lengths and values) of all features in one all-to-all, then lengths, values and
--     weights in one grouped all-to-all; the received keys, rank-major, are permuted to
--     key-major, which is the global batch of every feature in sample order;
--   forward: each rank pools its shards over the global batch: table- and column-wise shards'
--     outputs go back by all-to-all (each rank its B rows), row-wise partial sums by
--     reduce-scatter; data-parallel tables pool the rank's own batch; the pieces are put side
--     by side in the collection's feature order;
--   backward: the gradient the reverse way (all-to-all; all-gather for row-wise and data-
--     parallel tables, whose replicas all step on the global batch's gradient), into each
--     shard's fused optimizer step; tables in several column shards under rowwise Adagrad first
--     add their shards' per-row sums of squared gradients over the ranks (_sum_rows).
-- Every shard thus sees its rows' gradients in the unsharded order, so its rows step as the
-- unsharded table's would (bit for bit where pooling adds the same numbers in the same order:
-- all but row-wise tables of multi-id bags, whose partial sums are added over the ranks).
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local Module = require "uvmrec.nn.Module"
local tbe = require "uvmrec.tbe"
local tensor = require "uvmrec.tensor"
local kjt = require "uvmrec.kjt"
local dense = require "uvmrec.dense"
local planner = require "uvmrec.dist.plan"

local Sharded = Module:extend("ShardedEmbeddingBagCollection")

-- The unsharded collection's options (uvmrec.tbe's) and vbe; a table's own but its shard, which
-- the plan sets.
local OPTS, TABLE_OPTS = { vbe = true }, {}
for k in pairs(tbe.OPTS) do OPTS[k] = true end
for k in pairs(tbe.TABLE_OPTS) do TABLE_OPTS[k] = k ~= "shard" or nil end
local O = require("uvmrec.table_options").checks("dist.shard")
local IN = require("uvmrec.table_options").checks("ShardedEmbeddingBagCollection")

local COMMON = { "optimizer", "bounds", "seed", "device", "stochastic_rounding", "output_dtype", "pooling",
                 "placement", "dtype", "state_placement", "cache" }

local function copy_table(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- The collection's options (an EmbeddingBagCollection's, or the table it was made from), the
-- plan's spec and the communicator.
function Sharded:__init(opts, spec, comm)
  Module.__init(self)
  if type(opts) ~= "table" or type(opts.tables) ~= "table" then
    error("dist.shard: expected an embedding bag collection or its options", 4)
  end
  O.check_keys(opts, OPTS, "collection ", 4)
  for i, t in ipairs(opts.tables) do
    if type(t) ~= "table" then O.fail(("table %d is not a table"):format(i), 4) end
    O.check_keys(t, TABLE_OPTS, "table ", 4)
  end
  if not comm then error("dist.shard: no communicator (call dist.init() first)", 4) end
  self.comm = comm
  local W, me = comm.world, comm.rank
  self.world, self.rank = W, me
  local tables = opts.tables
  local ok, plan = pcall(planner.plan, tables, spec, W, opts.pooling)
  if not ok then error(plan, 4) end
  self.plan = plan
  self.output_dtype = opts.output_dtype or "f32"
  -- Rowwise Adagrad steps a row by the mean of its squared gradient over the whole row, which a
  -- column shard holds a part of: per table in several column shards, every shard's per-row
  -- sums over its columns are added up over the ranks (_sum_rows) before the step.
  local optim = opts.optimizer
  local oname = type(optim) == "table" and (optim.name or optim[1]) or optim
  if oname == "rowwise_adagrad" then
    local list, at = {}, 0
    for _, t in ipairs(tables) do
      local p = plan.tables[t.name]
      if p.kind == "column_wise" and #p.shards > 1 then
        local mine = {}
        for s, sh in ipairs(p.shards) do
          if sh.rank == me then mine[#mine + 1] = ("%s/c%d"):format(t.name, s - 1) end
        end
        list[#list + 1] = { name = t.name, at = at, rows = t.rows, shards = mine }
        at = at + t.rows
      end
    end
    if #list > 0 then self.row_sums = { tables = list, total = at } end
  end

  local features, table_opts, key_rows = {}, {}, {}
  for _, t in ipairs(tables) do
    table_opts[t.name] = t
    for _, f in ipairs(t.features or { t.name }) do
      features[#features + 1] = f
      key_rows[f] = t.rows
    end
  end
  self.key_rows = key_rows
  self.features = opts.features and { unpack(opts.features) } or features
  self.table_opts = table_opts
  self.default_dtype = opts.dtype or "f32"

  -- Per rank, its table- and column-wise shards' features in their collection's order: the
  -- keys it receives and the columns it sends back.  Every rank computes every rank's list.
  local a2a = {}
  for r = 0, W - 1 do a2a[r] = { feats = {}, tables = {}, dim = 0 } end
  local rw = { feats = {}, tables = {}, dim = 0 }
  local dp = { feats = {}, tables = {}, dim = 0 }
  self.rw_blocks = nil
  local function base_of(t, name, i)
    local o = { name = name, rows = t.rows, dim = t.dim, dtype = t.dtype, pooling = t.pooling,
                placement = t.placement, state_placement = t.state_placement,
                shard = { logical = i - 1, rows = t.rows, dim = t.dim } }
    return o
  end
  -- Table o in group g, reading features fs (each named with suffix after it, when given):
  -- each feature's columns follow the group's so far.
  local function place(g, o, fs, suffix, shard)
    o.features = {}
    for _, f in ipairs(fs) do
      local name = suffix and f .. suffix or f
      o.features[#o.features + 1] = name
      g.feats[#g.feats + 1] = { src = f, name = name, dim = o.dim, col = g.dim, shard = shard }
      g.dim = g.dim + o.dim
    end
    g.tables[#g.tables + 1] = o
  end
  for i, t in ipairs(tables) do
    local p = plan.tables[t.name]
    local fs = t.features or { t.name }
    if p.kind == "table_wise" then
      place(a2a[p.shards[1].rank], base_of(t, t.name, i), fs)
    elseif p.kind == "column_wise" then
      for s, sh in ipairs(p.shards) do
        local o = base_of(t, ("%s/c%d"):format(t.name, s - 1), i)
        o.dim = sh.dim
        o.shard.col0 = sh.col0
        place(a2a[sh.rank], o, fs, ("/c%d"):format(s - 1), s)
      end
    elseif p.kind == "row_wise" then
      local sh = p.shards[me + 1]
      -- A block past the table's end holds no row: it gets one that no id reaches.
      local o = base_of(t, ("%s/r%d"):format(t.name, me), i)
      o.rows = math.max(sh.rows, 1)
      o.shard.row0 = sh.rows > 0 and sh.row0 or t.rows - 1
      place(rw, o, fs)
      self.rw_blocks = self.rw_blocks or {}
      for _, f in ipairs(fs) do self.rw_blocks[f] = { block = p.block, rows = t.rows } end
    else
      place(dp, base_of(t, t.name, i), fs)
    end
  end
  self.a2a, self.rw, self.dp = a2a, rw, dp

  -- This rank's collections, one per kind of exchange.
  local common = {}
  for _, k in ipairs(COMMON) do common[k] = opts[k] end
  if common.device == nil and comm.device and comm.device >= 0 then common.device = comm.device end
  -- Shards on a GPU exchange device tensors, which only a communicator made for that GPU
  -- carries (NCCL, or in a world of one its copy): refused here, before anything is built, not
  -- in the first forward's all-to-all.
  local gpu, cdev = lib.device_option(common.device, 4), comm.device or -1
  if gpu >= 0 and gpu ~= cdev then
    error(("dist.shard: rank %d's shards are on GPU %d, and its communicator %s: make it with "
      .. "dist.comm{device = %d} (dist.init() takes the rank's GPU), or keep the shards on the host "
      .. "(device = \"cpu\")"):format(me, gpu, cdev < 0
        and "was made for host memory only (device -1), so it cannot exchange their tensors"
        or ("runs its device collectives on GPU %d"):format(cdev), gpu), 4)
  end
  local function build(group, what)
    if #group.tables == 0 then return nil end
    -- a rank's cached shards of a kind share one cache, whose rows have one width
    local first
    for _, t in ipairs(group.tables) do
      if (t.placement or common.placement) == "cached" then
        first = first or t
        if t.dim ~= first.dim then
          error(("dist.shard: rank %d's cached %s shards '%s' (%d columns) and '%s' (%d) would share its cache, "
            .. "whose rows have one width: shard table '%s' another way, or place it device or managed")
            :format(me, what, first.name, first.dim, t.name, t.dim,
                    (t.dim < first.dim and t or first).name:match("^[^/]+")), 5)
        end
      end
    end
    local o = copy_table(common)
    o.tables = group.tables
    local c, err = tbe.new(o, 5)
    if not c then error(("dist.shard: rank %d's %s shards: %s"):format(me, what, err), 5) end
    return c
  end
  self.tbe_a2a = build(a2a[me], "table- and column-wise")
  self.tbe_rw = build(rw, "row-wise")
  self.tbe_dp = build(dp, "data-parallel")
  self.collections = {}
  for _, key in ipairs { "tbe_a2a", "tbe_rw", "tbe_dp" } do
    if self[key] then self.collections[#self.collections + 1] = self[key] end
  end
  -- the prefetch pipeline prepares every batch (its prepare is the input exchange); the
  -- managed shards are those whose pages it prefetches
  self.prepare_always = true
  for _, c in ipairs(self.collections) do
    for _, name in ipairs(c.managed or {}) do
      self.managed = self.managed or {}
      self.managed[#self.managed + 1] = name
    end
  end
  local any = self.collections[1]
  self.device = any and any.device or -1
  self.placement = self.device >= 0 and "device" or "host"
  if self.row_sums then self:_row_sums_init() end

  -- What every rank sends each rank (keys of the bucketized input), and what it receives.
  self.send_keys = {}
  for d = 0, W - 1 do
    local list = {}
    for _, f in ipairs(a2a[d].feats) do list[#list + 1] = f.src end
    for _, f in ipairs(rw.feats) do list[#list + 1] = ("%s@%d"):format(f.src, d) end
    for _, f in ipairs(dp.feats) do list[#list + 1] = f.src end
    self.send_keys[d] = list
  end
  local recv = {}
  for _, g in ipairs { a2a[me], rw, dp } do
    for _, f in ipairs(g.feats) do recv[#recv + 1] = f.name end
  end
  self.recv_keys = recv
  self.nrecv = #recv
  self.groups = { #a2a[me].feats, #rw.feats, #dp.feats }
  local rank_major, key_major = {}, {}
  for s = 0, W - 1 do
    for k = 1, #recv do rank_major[#rank_major + 1] = ("%s#%d"):format(recv[k], s) end
  end
  for k = 1, #recv do
    for s = 0, W - 1 do key_major[#key_major + 1] = s * #recv + k end
  end
  self.rank_major_keys, self.key_major_order = rank_major, key_major
  self.dp_keys = {}
  for _, f in ipairs(dp.feats) do self.dp_keys[#self.dp_keys + 1] = f.src end

  -- The output's pieces in the collection's order: {source, column, width}; sources are
  -- 1..W (rank s's table- and column-wise block), W + 1 (row-wise), W + 2 (data-parallel).
  local pieces, out_dim = {}, 0
  local where = {}
  for s = 0, W - 1 do
    for _, f in ipairs(a2a[s].feats) do
      where[f.src] = where[f.src] or {}
      where[f.src][#where[f.src] + 1] = { src = s + 1, col = f.col, width = f.dim, shard = f.shard or 1 }
    end
  end
  for _, f in ipairs(rw.feats) do where[f.src] = { { src = W + 1, col = f.col, width = f.dim, shard = 1 } } end
  for _, f in ipairs(dp.feats) do where[f.src] = { { src = W + 2, col = f.col, width = f.dim, shard = 1 } } end
  for _, f in ipairs(self.features) do
    local list = where[f]
    if not list then error(("dist.shard: feature '%s' is on no table"):format(tostring(f)), 4) end
    table.sort(list, function(a, b) return a.shard < b.shard end) -- column shards in column order
    for _, p in ipairs(list) do
      pieces[#pieces + 1] = p
      out_dim = out_dim + p.width
    end
  end
  self.out_dim = out_dim
  self.pieces = pieces
  -- per source, its pieces in column order (they tile its columns)
  local by_src = {}
  for i, p in ipairs(pieces) do
    by_src[p.src] = by_src[p.src] or {}
    by_src[p.src][#by_src[p.src] + 1] = i
  end
  for _, list in pairs(by_src) do
    table.sort(list, function(a, b) return pieces[a].col < pieces[b].col end)
  end
  self.by_src = by_src
  self.a2a_dims = {}
  for s = 0, W - 1 do self.a2a_dims[s + 1] = a2a[s].dim end
  self._counts = { {}, {}, {}, {}, {}, {} }
  -- VBE (opts.vbe, or set_vbe): each rank sends each feature's distinct bags only
  self.vbe = opts.vbe and true or false
end

-- The row sums of the tables in several column shards under rowwise Adagrad: one f32 buffer of
-- every such table's rows on every rank (rank-independent layout), the segment of each table
-- lent to this rank's first shard of it; a further shard of it on this rank (a plan with
-- `ranks` naming a rank twice) gets its own buffer, added into the segment before the
-- all-reduce and given the total after it.
function Sharded:_row_sums_init()
  local rs = self.row_sums
  local dev = self.device >= 0 and self.device or (self.comm.device or -1)
  local o = { dtype = "f32", placement = dev >= 0 and "device" or "host", device = dev >= 0 and dev or nil }
  rs.buf = assert(tensor.tensor({ rs.total }, o))
  rs.extra, rs.held, rs.seconds, rs.calls, rs.reduce_seconds = {}, false, 0, 0, 0
  for _, t in ipairs(rs.tables) do
    t.view = rs.buf:view_as(t.at, { t.rows })
    for j, shard in ipairs(t.shards) do
      local b = t.view
      if j > 1 then
        b = assert(tensor.tensor({ t.rows }, o))
        rs.extra[#rs.extra + 1] = { seg = t.view, buf = b }
      end
      self.tbe_a2a:set_row_sums(shard, b)
      rs.held = true
    end
  end
end

-- seg += buf, elementwise (rows floats; host memory, or through it from a GPU).
local function add_into(seg, buf)
  local hs, hb = seg, buf
  if seg:placement() ~= "host" then hs, hb = assert(seg:to("host")), assert(buf:to("host")) end
  local n = seg:numel()
  local d = ffi.cast("float *", lib.C.ur_tensor_data(hs.p))
  local e = ffi.cast("float *", lib.C.ur_tensor_data(hb.p))
  for i = 0, n - 1 do d[i] = d[i] + e[i] end
  if hs ~= seg then
    assert(seg:copy(hs))
    hs:free()
    hb:free()
  end
end

-- Backward's first half for the tables in several column shards: each of this rank's shards
-- writes its rows' partial sums of squared gradients over its columns, the ranks' sums are
-- added (one all-reduce of rows x 4 bytes per table, every rank taking part, zeros where it
-- holds no shard), and each shard's step then takes the whole row's sum.
-- rs.seconds / rs.calls: the host time in here (on the CPU the whole of it; on a GPU what the
-- host waits for); rs.reduce_seconds: the part in the all-reduce.
-- parts, ticket: the batch's exchanged ids per collection and its table-wise collection's cache
-- ticket (nil without the pipeline).
function Sharded:_sum_rows(parts, ticket, grad, stream)
  local rs, comm = self.row_sums, self.comm
  local t0 = lib.C.ur_clock_seconds()
  assert(rs.buf:fill(0, stream))
  if rs.held then
    assert(self.tbe_a2a:row_sums(parts[1], grad, stream, ticket))
    for _, x in ipairs(rs.extra) do add_into(x.seg, x.buf) end
  end
  local t1 = lib.C.ur_clock_seconds()
  assert(comm:all_reduce(rs.buf, "sum", stream))
  assert(comm:wait(stream))
  local t2 = lib.C.ur_clock_seconds()
  for _, x in ipairs(rs.extra) do assert(x.buf:copy(x.seg, stream)) end
  rs.seconds, rs.calls = rs.seconds + lib.C.ur_clock_seconds() - t0, rs.calls + 1
  rs.reduce_seconds = rs.reduce_seconds + t2 - t1
end

-- ---- the input exchange ----

local function fill(list, n, v)
  for i = 1, n do list[i] = v end
  return list
end

local function new_like(kj, dtype, n)
  local place = kj:placement()
  local o = { dtype = dtype, placement = place }
  if place == "device" or place == "managed" then o.device = kj:device() end
  return assert(tensor.tensor({ n }, o))
end

-- The exchange's results are read on the host (the splits) and by KJT operations, which take
-- no stream (the legacy one, which a side stream's work is not ordered before: the prefetch
-- pipeline's on a GPU); comm:wait orders only `stream`, so the host waits for that too.
local function settle(comm, stream)
  assert(comm:wait(stream))
  if stream ~= nil then assert(stream:sync()) end
end

-- The global batch of this rank's shards' features, as one KJT (key-major, stride W * B).
function Sharded:_exchange(input, stream)
  local comm, W, me = self.comm, self.world, self.rank
  stream = stream or self.stream
  local B = input:stride()
  local kin = input
  if self.rw_blocks then kin = assert(input:bucketize(W, self.rw_blocks)) end
  if not self._order then
    local index = {}
    for i, k in ipairs(kin:keys()) do index[k] = i end
    local order = {}
    for d = 0, W - 1 do
      for _, k in ipairs(self.send_keys[d]) do
        if not index[k] then
          error(("dist: the input has no key '%s' (keys: %s)"):format(k, table.concat(kin:keys(), ", ")), 4)
        end
        order[#order + 1] = index[k]
      end
    end
    self._order = order
  end
  -- VBE: per key, this rank's distinct bags only, and every sample's bag (inverse indices)
  local dedup = self.vbe and assert(kin:dedup()) or nil
  local send = assert((dedup or kin):permute(self._order))
  if dedup then dedup:free() end
  if kin ~= input then kin:free() end

  -- splits first: per destination and key, the samples, the bags (the samples without VBE)
  -- and the values
  local n = #self._order
  local sp = ffi.new("int64_t[?]", 3 * n)
  local send_len, send_val, at = self._counts[1], self._counts[2], 0
  local send_inv = self._counts[5]
  for d = 0, W - 1 do
    local nk, nv, nb = #self.send_keys[d], 0, 0
    for k = 1, nk do
      local span = send:key_span(at + k)
      local v, bags = span.values[2] - span.values[1], span.bags[2] - span.bags[1]
      local i = 3 * (at + k - 1)
      sp[i], sp[i + 1], sp[i + 2] = B, bags, v
      nv, nb = nv + v, nb + bags
    end
    send_len[d + 1], send_val[d + 1], send_inv[d + 1] = nb, nv, nk * B
    at = at + nk
  end
  local host_splits = tensor.tensor({ 3 * n }, { dtype = "i64" })
  lib.must(lib.C.ur_tensor_write(host_splits.p, 0, 3 * n, sp))
  local splits = host_splits
  if send:placement() == "device" then splits = assert(host_splits:to("device", send:device(), stream)) end
  local K = self.nrecv
  local rsplits = new_like(send, "i64", 3 * K * W)
  local sc, rc = {}, fill({}, W, 3 * K)
  for d = 0, W - 1 do sc[d + 1] = 3 * #self.send_keys[d] end
  assert(comm:all_to_all(splits, rsplits, sc, rc, stream))
  settle(comm, stream)
  local r = rsplits:totable()
  local recv_len, recv_val = self._counts[3], self._counts[4]
  local recv_inv = self._counts[6]
  local total_len, total_val = 0, 0
  local bags = {} -- bags[s * K + k + 1]: source s's bags of key k
  for s = 0, W - 1 do
    local l, v = 0, 0
    for k = 0, K - 1 do
      local i = 3 * (s * K + k)
      local b = r[i + 1]
      if b ~= B then
        error(("dist: rank %d has a batch of %d samples and rank %d of %d; the ranks take equal shares "
          .. "of a global batch"):format(me, B, s, b), 4)
      end
      bags[s * K + k + 1] = r[i + 2]
      l, v = l + r[i + 2], v + r[i + 3]
    end
    recv_len[s + 1], recv_val[s + 1], recv_inv[s + 1] = l, v, K * B
    total_len, total_val = total_len + l, total_val + v
  end

  -- then lengths, values, weights (and VBE's inverse indices) in one grouped exchange
  local lengths, values, weights = send:lengths(), send:values(), send:weights()
  local inverse = dedup and send:inverse_indices() or nil
  local rl, rv = new_like(send, "i32", total_len), new_like(send, "i64", total_val)
  local rwt = weights and new_like(send, "f32", total_val) or nil
  local rinv = inverse and new_like(send, "i64", W * K * B) or nil
  assert(comm:group_start())
  assert(comm:all_to_all(lengths, rl, send_len, recv_len, stream))
  assert(comm:all_to_all(values, rv, send_val, recv_val, stream))
  if weights then assert(comm:all_to_all(weights, rwt, send_val, recv_val, stream)) end
  if inverse then assert(comm:all_to_all(inverse, rinv, send_inv, recv_inv, stream)) end
  assert(comm:group_end(stream))
  settle(comm, stream)
  lengths:free()
  values:free()
  if weights then weights:free() end
  if inverse then inverse:free() end
  send:free()
  host_splits:free()
  if splits ~= host_splits then splits:free() end
  rsplits:free()

  -- rank-major (source, key, bag) to key-major (key, source, bag): the global batch
  local rk_opts = { keys = self.rank_major_keys, values = rv, lengths = rl, weights = rwt, stride = B, check = false }
  if rinv then
    local per = {}
    for i = 1, W * K do per[i] = { bags[i] } end
    rk_opts.stride, rk_opts.stride_per_key_per_rank, rk_opts.inverse_indices = nil, per, rinv
  end
  local rk = kjt.new(rk_opts, 3)
  local km = assert(rk:permute(self.key_major_order))
  local kv, kl, kw = km:values(), km:lengths(), km:weights()
  local g_opts = { keys = self.recv_keys, values = kv, lengths = kl, weights = kw, stride = W * B, check = false }
  local ginv
  if rinv then
    -- key k's bags are every source's in turn: sample (s, b) reads bag offset(s, k) + its own
    local kinv = km:inverse_indices()
    local host = kinv:placement() == "host" and kinv or assert(kinv:to("host"))
    ginv = host == kinv and assert(tensor.tensor({ W * K * B }, { dtype = "i64" })) or host
    local src = ffi.cast("int64_t *", lib.C.ur_tensor_data(host.p))
    local dst = ffi.cast("int64_t *", lib.C.ur_tensor_data(ginv.p))
    local per = {}
    for k = 0, K - 1 do
      local off = 0
      for s = 0, W - 1 do
        local base = (k * W + s) * B
        for b = 0, B - 1 do dst[base + b] = src[base + b] + off end
        off = off + bags[s * K + k + 1]
      end
      per[k + 1] = { off }
    end
    if kinv:placement() ~= "host" then
      -- on the default stream, before the KJT's make reads it there (its inverse indices' check)
      local dev = assert(ginv:to(kinv:placement(), kinv:device()))
      ginv:free()
      ginv = dev
    end
    kinv:free()
    g_opts.stride, g_opts.stride_per_key_per_rank, g_opts.inverse_indices = nil, per, ginv
  end
  local glob = kjt.new(g_opts, 3)
  local done = { rv, rl, rwt, kv, kl, kw, rinv, ginv }
  for i = 1, 8 do
    if done[i] then done[i]:free() end
  end
  rk:free()
  km:free()
  return glob, B
end

-- ---- batches exchanged ahead (the prefetch pipeline) ----

-- A batch's exchanged input: {glob (the global batch of this rank's shards' features), parts
-- (glob split per kind of exchange), B, mine (the data-parallel features of the rank's own
-- batch), tickets (per shard collection: a2a, rw, dp_mine, dp; those of cached tables)}; a
-- ticket of prepare is one with ticket = true.
local function free_batch(b)
  if b.freed then return end
  b.freed = true
  for _, p in ipairs(b.parts) do p:free() end
  b.glob:free()
  if b.mine then b.mine:free() end
end

-- The shard collections a ticket's tickets belong to, in the order they are prepared.
local TICKETS = { { "a2a", "tbe_a2a" }, { "rw", "tbe_rw" }, { "dp_mine", "tbe_dp" }, { "dp", "tbe_dp" } }

local function exchanged(self, input, stream)
  local glob, B = self:_exchange(input, stream)
  local b = { glob = glob, parts = assert(glob:split(self.groups)), B = B, tickets = {} }
  if self.tbe_dp then b.mine = assert(input:permute(self.dp_keys)) end
  return b
end

-- prepare(input[, stream]): the batch's input exchange run now, ahead of its forward (the
-- prefetch pipeline does, on its own stream, while the batch before computes), and the rows
-- of its ids brought into the caches of this rank's cached shards.  A collective: every rank
-- prepares its batches in the same order, and forwards them in that order.  Returns the
-- batch's ticket, which goes with the batch to forward and backward (they exchange nothing
-- then); nil, message when a cache failed (memory, the HBM budget).
function Sharded:prepare(input, stream)
  self:_check_input(input, true)
  local t = exchanged(self, input, stream or self.stream)
  t.ticket, t.sharded, t.input, t.retired = true, self, input, false
  local src = { a2a = t.parts[1], rw = t.parts[2], dp_mine = t.mine, dp = t.parts[3] }
  for _, k in ipairs(TICKETS) do
    local c = self[k[2]]
    if c and c.cache then
      local tk, err = c:prepare(src[k[1]], stream or self.stream)
      if not tk then
        self:retire(t, false, stream)
        return nil, err
      end
      t.tickets[k[1]] = tk
    end
  end
  return t
end

-- retire(ticket[, trained][, stream]): a batch's ticket done with (a batch dropped unread, or
-- read by a forward without backward: its shards' tickets are retired, only read; backward
-- retires its own, trained).  A ticket retired already is left alone.
function Sharded:retire(ticket, trained, stream)
  if ticket == nil then
    for _, c in ipairs(self.collections) do assert(c:retire(nil, false, stream or self.stream)) end
    return true
  end
  if ticket.retired then return true end
  ticket.retired = true
  for _, k in ipairs(TICKETS) do
    local tk = ticket.tickets[k[1]]
    if tk and not tk.retired then
      local ok, err = self[k[2]]:retire(tk, trained, stream or self.stream)
      if not ok then return nil, err end
    end
  end
  -- the batch's forward may still read them on a GPU: its ids go with the next forward
  if self._cur ~= ticket then free_batch(ticket) end
  return true
end

-- The batch a forward pools: the ticket's, or the input exchanged now.  The batch before is
-- let go (a ticket never trained is retired, only read).
function Sharded:_take(input, ticket)
  local prev = self._cur
  if ticket then
    if type(ticket) ~= "table" or ticket.sharded ~= self then
      error(self:type_name() .. ": the ticket is not one of this collection's prepare", 4)
    end
    if ticket.retired then
      error(self:type_name() .. ": the batch's ticket was retired already (trained or dropped)", 4)
    end
    if ticket.input ~= input then
      error(self:type_name() .. ": the ticket was prepared for another input than the forward's", 4)
    end
  end
  if prev and prev ~= ticket then
    if prev.ticket and not prev.retired then assert(self:retire(prev, false)) end
    free_batch(prev)
  end
  local cur = ticket or exchanged(self, input)
  cur.done = false
  self._cur = cur
  return cur
end

-- prefetch_pages(ticket[, stream][, location]): the pages of the managed shards' rows that a
-- prepared batch reads (its exchanged ids: the rank's own batch does not say which rows of its
-- shards the ranks read) prefetched to the GPU, as uvmrec.tbe's prefetch_pages; returns its
-- statistics summed over this rank's shard collections.
local PAGE_SUMS = { "ids", "skipped_ids", "rows", "pages", "runs", "runs_skipped", "bytes", "bytes_skipped" }
function Sharded:prefetch_pages(ticket, stream, location)
  if type(ticket) ~= "table" or ticket.sharded ~= self then
    error(self:type_name() .. ": prefetch_pages takes a batch's ticket of prepare (its exchanged ids)", 2)
  end
  local sum = { location = location, issued = false }
  for _, k in ipairs(PAGE_SUMS) do sum[k] = 0 end
  local src = { tbe_a2a = ticket.parts[1], tbe_rw = ticket.parts[2], tbe_dp = ticket.parts[3] }
  for _, key in ipairs { "tbe_a2a", "tbe_rw", "tbe_dp" } do
    local c = self[key]
    if c and c.managed then
      local ps, err = c:prefetch_pages(src[key], stream or self.stream, location)
      if not ps then return nil, err end
      for _, k in ipairs(PAGE_SUMS) do sum[k] = sum[k] + ps[k] end
      sum.location, sum.issued = ps.location, sum.issued or ps.issued
    end
  end
  return sum
end

-- This rank's shards' cache counters (uvmrec.cache's stats summed over its shard collections,
-- .tables per shard; batches: the most any collection's cache saw), or nil without cached
-- shards.  A data-parallel collection's cache is asked twice a batch (the rank's own samples
-- for the forward, the global batch for the backward), so its lookups count twice, the second
-- mostly hits.
function Sharded:cache_stats()
  local r
  for _, c in ipairs(self.collections) do
    if c.cache then
      local s = c.cache:stats()
      if not r then
        r = s
      else
        for k, v in pairs(s) do
          if k == "batches" then r[k] = math.max(r[k], v)
          elseif type(v) == "number" then r[k] = r[k] + v end
        end
        for name, t in pairs(s.tables) do r.tables[name] = t end
      end
    end
  end
  if r then r.hit_rate = r.unique > 0 and r.hits / r.unique or 0 end
  return r
end

-- ---- forward ----

local function buf(self, key, rows, cols) return self:buffer(key, self.output_dtype, rows, cols) end

function Sharded:_check_input(input, ids)
  if type(input) ~= "cdata" or type(input.keys) ~= "function" then
    error(self:type_name() .. ": the input must be a KJT (its keys in the collection's feature order)", 3)
  end
  -- as the unsharded collection checks them: the exchange's key order is fixed at the first input
  IN.same_keys(input:keys(), self.features, 3)
  -- An id outside its table is found by the rank holding the shard, in the global batch (another
  -- rank's error, naming a sample of the global batch): on the host, each rank checks its own
  -- input first (one pass over the ids; on a GPU that would wait for the device every batch).
  -- Elsewhere a KJT not known checked has its bags checked (kjt.need_checked: a checked one costs
  -- nothing), so that a bad one fails on its own rank before the exchange, not as another rank's
  -- bags or a forward's out-of-bounds reads; the exchange's KJTs are then sound by construction.
  if ids and input:placement() == "host" then
    local ok, err = input:validate(self.key_rows)
    if not ok then error(("%s: rank %d's input: %s"):format(self:type_name(), self.rank, err), 3) end
  elseif ids then
    local ok, err = kjt.need_checked(input, ("%s: rank %d's input"):format(self:type_name(), self.rank), 3)
    if not ok then error(err, 3) end
  end
end

-- forward(input[, ticket]) (Module's): a ticket of prepare brings the batch's exchanged ids (and
-- its rows in the shards' caches); without one the exchange runs now.  In evaluation (no
-- backward follows) the ticket is retired after the forward.
function Sharded:updateOutput(input, ticket)
  self:_check_input(input, ticket == nil) -- a ticket's input was checked by prepare
  local comm, W, stream = self.comm, self.world, self.stream
  local cur = self:_take(input, ticket)
  local parts, B = cur.parts, cur.B
  self._B = B
  local srcs = {}
  -- table- and column-wise: pool the global batch, send each rank its rows back
  local D = self.a2a[self.rank].dim
  local total = 0
  for s = 1, W do total = total + self.a2a_dims[s] end
  if total > 0 then
    local recv = buf(self, "a2a_recv", 1, B * total)
    if self.tbe_a2a then
      local out = buf(self, "a2a_out", W * B, D)
      assert(self.tbe_a2a:forward(parts[1], out, stream, cur.tickets.a2a))
      self._send = out
    else
      self._send = self:_empty()
    end
    local sc, rc = {}, {}
    for s = 1, W do
      sc[s], rc[s] = B * D, B * self.a2a_dims[s]
    end
    assert(comm:all_to_all(self._send, recv, sc, rc, stream))
    local at = 0
    for s = 1, W do
      local d = self.a2a_dims[s]
      if d > 0 then srcs[s] = recv:view_as(at, { B, d }) end
      at = at + B * d
    end
  end
  -- row-wise: partial sums over the global batch, reduced and scattered
  if self.tbe_rw then
    local out = buf(self, "rw_out", W * B, self.rw.dim)
    assert(self.tbe_rw:forward(parts[2], out, stream, cur.tickets.rw))
    srcs[W + 1] = buf(self, "rw_local", B, self.rw.dim)
    assert(comm:reduce_scatter(out, srcs[W + 1], "sum", stream))
  end
  assert(comm:wait(stream))
  -- data-parallel: this rank's own batch
  if self.tbe_dp then
    srcs[W + 2] = buf(self, "dp_out", B, self.dp.dim)
    assert(self.tbe_dp:forward(cur.mine, srcs[W + 2], stream, cur.tickets.dp_mine))
  end
  -- the pieces side by side in the collection's order
  local pieces = self._piece_bufs or {}
  self._piece_bufs = pieces
  for i, p in ipairs(self.pieces) do pieces[i] = buf(self, "piece" .. i, B, p.width) end
  for src, list in pairs(self.by_src) do
    local parts_of = {}
    for j, i in ipairs(list) do parts_of[j] = pieces[i] end
    dense.split(srcs[src], parts_of, stream)
  end
  self.output = buf(self, "output", B, self.out_dim)
  dense.concat(pieces, self.output, stream)
  for s = 1, W do
    if srcs[s] then srcs[s]:free() end
  end
  if ticket and not self.train then assert(self:retire(ticket, false, stream)) end
  return self.output
end

-- Ids have no gradient.
Sharded.updateGradInput = Module.no_grad_input

-- backward(input, gradOutput[, ticket]) (Module's): the ticket the forward took (retired,
-- trained).
-- The fused optimizer step of every shard, from the gradient of this rank's output.
function Sharded:accGradParameters(input, gradOutput, ticket) -- luacheck: ignore 212 (the input came through forward)
  local comm, W, stream, B = self.comm, self.world, self.stream, self._B
  local cur = self._cur
  if not cur or cur.done then error(self:type_name() .. ": backward before forward", 3) end
  if ticket and ticket ~= cur then
    error(self:type_name() .. ": backward's ticket is not the one its forward took", 3)
  end
  local pieces = self._piece_bufs
  for i, p in ipairs(self.pieces) do pieces[i] = buf(self, "gpiece" .. i, B, p.width) end
  dense.split(gradOutput, pieces, stream)
  local grads = {}
  local total = 0
  for s = 1, W do total = total + self.a2a_dims[s] end
  local send = total > 0 and buf(self, "a2a_gsend", 1, B * total) or nil
  local at = 0
  for src = 1, W + 2 do
    local list = self.by_src[src]
    if list then
      local cols = src <= W and self.a2a_dims[src] or (src == W + 1 and self.rw.dim or self.dp.dim)
      local g
      if src <= W then g = send:view_as(at, { B, cols })
      else g = buf(self, src == W + 1 and "rw_glocal" or "dp_glocal", B, cols) end
      local parts_of = {}
      for j, i in ipairs(list) do parts_of[j] = pieces[i] end
      dense.concat(parts_of, g, stream)
      grads[src] = g
    end
    if src <= W then at = at + B * self.a2a_dims[src] end
  end
  local D = self.a2a[self.rank].dim
  local ga2a, grw, gdp
  if total > 0 then
    ga2a = D > 0 and buf(self, "a2a_grecv", W * B, D) or self:_empty()
    local sc, rc = {}, {}
    for s = 1, W do sc[s], rc[s] = B * self.a2a_dims[s], B * D end
    assert(comm:all_to_all(send, ga2a, sc, rc, stream))
  end
  if self.tbe_rw then
    grw = buf(self, "rw_gglobal", W * B, self.rw.dim)
    assert(comm:all_gather(grads[W + 1], grw, stream))
  end
  if self.tbe_dp then
    gdp = buf(self, "dp_gglobal", W * B, self.dp.dim)
    assert(comm:all_gather(grads[W + 2], gdp, stream))
  end
  assert(comm:wait(stream))
  for s = 1, W do
    if grads[s] then grads[s]:free() end
  end
  local parts, tk = cur.parts, cur.tickets
  if self.row_sums then self:_sum_rows(parts, tk.a2a, ga2a, stream) end
  if self.tbe_a2a then assert(self.tbe_a2a:backward(parts[1], ga2a, stream, tk.a2a)) end
  if self.tbe_rw then assert(self.tbe_rw:backward(parts[2], grw, stream, tk.rw)) end
  if self.tbe_dp then assert(self.tbe_dp:backward(parts[3], gdp, stream, tk.dp)) end
  -- a ticket's shard tickets are retired (trained) by the shards' backward; its exchanged ids
  -- are freed with the next batch's forward, as those of a batch exchanged in its forward
  if cur.ticket then
    if tk.dp_mine then assert(self.tbe_dp:retire(tk.dp_mine, false, stream)) end
    cur.retired = true
  end
  cur.done = true
end

-- A tensor of no elements where the collections run: what a rank without table- or
-- column-wise shards sends and receives.
function Sharded:_empty()
  if not self._none then
    local o = { dtype = self.output_dtype, placement = self.placement }
    if self.device >= 0 then o.device = self.device end
    self._none = assert(tensor.tensor({ 0 }, o))
  end
  return self._none
end

-- ---- tables ----

-- This rank's pieces of the logical tables: {name = the logical table, shard = its table in
-- `collection` (a uvmrec.tbe), kind, row0, rows, col0, cols (the block of the logical table it
-- holds), table_rows, table_dim, replica = true for data-parallel tables (every rank holds
-- them whole)}, in the collection's table order.  Row-wise blocks past a table's end (more
-- ranks than rows) hold no row and are left out.
function Sharded:blocks()
  local out, me = {}, self.rank
  for _, name in ipairs(self.plan.order) do
    local p = self.plan.tables[name]
    local function add(shard, coll, row0, rows, col0, cols)
      out[#out + 1] = { name = name, shard = shard, collection = coll, kind = p.kind, row0 = row0, rows = rows,
                        col0 = col0, cols = cols, table_rows = p.rows, table_dim = p.dim,
                        replica = p.kind == "data_parallel" or nil }
    end
    if p.kind == "table_wise" then
      if p.shards[1].rank == me then add(name, self.tbe_a2a, 0, p.rows, 0, p.dim) end
    elseif p.kind == "column_wise" then
      for s, sh in ipairs(p.shards) do
        if sh.rank == me then add(("%s/c%d"):format(name, s - 1), self.tbe_a2a, 0, p.rows, sh.col0, sh.dim) end
      end
    elseif p.kind == "row_wise" then
      local sh = p.shards[me + 1]
      if sh.rows > 0 then add(("%s/r%d"):format(name, me), self.tbe_rw, sh.row0, sh.rows, 0, p.dim) end
    else
      add(name, self.tbe_dp, 0, p.rows, 0, p.dim)
    end
  end
  return out
end

-- The name of a block of logical table `name` as parameters() and checkpoints give it: the
-- table's own name for the whole table, else "C3[250:500,0:16]" (rows, then columns).
local function block_name(b)
  if b.row0 == 0 and b.rows == b.table_rows and b.col0 == 0 and b.cols == b.table_dim then return b.name end
  return ("%s[%d:%d,%d:%d]"):format(b.name, b.row0, b.row0 + b.rows, b.col0, b.col0 + b.cols)
end

-- This rank's shards as parameters (fused: no gradient), named as views of the logical tables:
-- "C3" where this rank holds the whole table, "C3[250:500,0:16]" for a block of it; each has
-- `block` (Sharded:blocks()'s entry) and `shard` (its table's name in its collection).
function Sharded:parameters(prefix, out)
  out = out or {}
  prefix = prefix or ""
  for _, b in ipairs(self:blocks()) do
    out[#out + 1] = { name = prefix .. block_name(b), tensor = b.collection:table(b.shard), module = self,
                      fused = true, block = b, shard = b.shard }
  end
  return out
end

-- The whole logical table `name` [rows, dim] in host memory on every rank, gathered from its
-- shards (a collective: every rank calls it).
function Sharded:full_table(name)
  local p = self.plan.tables[name]
  if not p then error(("dist: no table named '%s'"):format(tostring(name)), 2) end
  local comm, W, me, stream = self.comm, self.world, self.rank, self.stream
  local function local_shard(shard_name, c)
    return assert(c:table(shard_name):to(self.device >= 0 and "device" or "host", nil, stream))
  end
  local function on_host(t) return assert(t:to("host")) end
  local dtype = self.table_opts[name].dtype or self.default_dtype
  local place = self.device >= 0 and "device" or "host"
  local function new(shape)
    local o = { dtype = dtype, placement = place, device = self.device >= 0 and self.device or nil }
    return assert(tensor.tensor(shape, o))
  end
  local full
  if p.kind == "data_parallel" then
    full = local_shard(name, self.tbe_dp)
  elseif p.kind == "table_wise" then
    local owner = p.shards[1].rank
    full = owner == me and local_shard(name, self.tbe_a2a) or new({ p.rows, p.dim })
    assert(comm:broadcast(full, owner, stream))
  elseif p.kind == "row_wise" then
    local counts = {}
    for r = 0, W - 1 do counts[r + 1] = p.shards[r + 1].rows * p.dim end
    local mine = local_shard(("%s/r%d"):format(name, me), self.tbe_rw)
    local part = mine:view_as(0, { p.shards[me + 1].rows * p.dim })
    full = new({ p.rows, p.dim })
    assert(comm:all_gather(part, full, counts, stream))
    assert(comm:wait(stream))
    part:free()
    mine:free()
  else
    local cols = {}
    for s, sh in ipairs(p.shards) do
      local shard_name = ("%s/c%d"):format(name, s - 1)
      cols[s] = sh.rank == me and local_shard(shard_name, self.tbe_a2a) or new({ p.rows, sh.dim })
      assert(comm:broadcast(cols[s], sh.rank, stream))
    end
    assert(comm:wait(stream))
    -- side by side, row by row in host memory (any dtype)
    local host = assert(tensor.tensor({ p.rows, p.dim }, { dtype = dtype }))
    local es = host:nbytes() / (p.rows * p.dim)
    local dst = ffi.cast("uint8_t *", lib.C.ur_tensor_data(host.p))
    for s, sh in ipairs(p.shards) do
      local c = on_host(cols[s])
      cols[s]:free()
      local src = ffi.cast("uint8_t *", lib.C.ur_tensor_data(c.p))
      local w = sh.dim * es
      for r = 0, p.rows - 1 do ffi.copy(dst + (r * p.dim + sh.col0) * es, src + r * w, w) end
      c:free()
    end
    return host
  end
  assert(comm:wait(stream))
  local h = on_host(full)
  full:free()
  return h
end

function Sharded:set_lr(lr)
  for _, c in ipairs(self.collections) do c:set_lr(lr) end
  return self
end

function Sharded:lr() return self.collections[1] and self.collections[1]:lr() end

-- A guard's flags gate every shard's fused step (uvmrec.train.guard); the dense gradients the
-- guard checks are all-reduced first, so a NaN on one rank holds every rank's step back.
function Sharded:set_gate(flags)
  for _, c in ipairs(self.collections) do c:set_gate(flags) end
  return self
end

-- bf16 precision makes the output (and the gradient it takes) bf16, as the unsharded one.  A
-- model's set_precision (Module's) sets it through set_output_precision (it marked a sharded
-- collection in a model bf16 and left its shards' outputs f32); level as error's.
function Sharded:set_output_precision(precision, level)
  local dtype = precision == "bf16" and "bf16" or "f32"
  for _, c in ipairs(self.collections) do self:op(level + 1, c.set_output_dtype, c, dtype) end
  self.output_dtype, self.precision = dtype, precision
  self._bufs = {}
  if self._none then self._none:free() end
  self._none = nil
end

-- VBE over ranks on or off: with it each rank sends, per feature, only its distinct bags (same
-- ids and weights) and every sample's bag (inverse indices); the receiving shards pool the
-- distinct bags and expand the pooled rows to every sample, so the outputs are the same.
function Sharded:set_vbe(on)
  self.vbe = on and true or false
  return self
end

function Sharded:features() return { unpack(self.features) } end
function Sharded:to() return self end
function Sharded:zero_grad() return self end

function Sharded:free()
  if self._cur then free_batch(self._cur) end
  self._cur = nil
  for _, c in ipairs(self.collections) do c:free() end
  local rs = self.row_sums
  if rs and rs.buf then
    for _, x in ipairs(rs.extra) do x.buf:free() end
    for _, t in ipairs(rs.tables) do t.view:free() end
    rs.buf:free()
    rs.buf = nil
  end
end

function Sharded:extra_repr()
  local kinds = {}
  for _, name in ipairs(self.plan.order) do
    local k = self.plan.tables[name].kind
    kinds[k] = (kinds[k] or 0) + 1
  end
  local parts = {}
  for _, k in ipairs { "table_wise", "row_wise", "column_wise", "data_parallel" } do
    if kinds[k] then parts[#parts + 1] = ("%d %s"):format(kinds[k], k) end
  end
  return ("(%d tables: %s; rank %d of %d, %d features -> %d)"):format(#self.plan.order, table.concat(parts, ", "),
    self.rank, self.world, #self.features, self.out_dim)
end

local M = { Sharded = Sharded, block_name = block_name }

-- dist.shard(collection, plan[, comm]): a sharded collection over the job's ranks with the
-- collection's forward and backward.  collection: an EmbeddingBagCollection (its options are
-- rebuilt as shards; free the original when done with it) or the options themselves (then no
-- rank ever holds a whole table it does not own).  plan: a kind for every table or
-- {default =, [table] = kind}, as uvmrec.dist.plan reads it.  comm (default: the job's, from
-- dist.init): shards on a GPU need one made for that GPU, where they go when the options name
-- no device.
function M.shard(collection, spec, comm)
  comm = comm or require("uvmrec.dist").job()
  local opts = collection
  if type(collection) == "table" and collection.options then opts = collection.options end
  -- not a tail call: Sharded's errors name the caller's line (their levels count this frame)
  local sharded = Sharded(opts, spec, comm)
  return sharded
end

-- dist.shard_modules(model, plan[, opts]): every EmbeddingBagCollection of the model replaced
-- by its sharded collection (the originals freed); the dense modules made data-parallel
-- (uvmrec.dist.ddp: gradients all-reduced in buckets during the backward) and the model's
-- BCE criterion taken over the global batch.  opts: comm, bucket_bytes.  Returns the model.
function M.shard_modules(model, spec, opts)
  opts = opts or {}
  local comm = opts.comm or require("uvmrec.dist").job()
  local EBC = require "uvmrec.nn.EmbeddingBagCollection"
  local function visit(m)
    local kids = m.modules
    if not kids then return end
    for i, c in ipairs(kids) do
      if Module.is(c, EBC) then
        local s = M.shard(c, spec, comm)
        s:share_arena(m)
        kids[i] = s
        for k, v in pairs(m) do
          if v == c then m[k] = s end
        end
        c.tbe:free()
      else
        visit(c)
      end
    end
  end
  visit(model)
  require("uvmrec.dist.ddp").data_parallel(model, { comm = comm, bucket_bytes = opts.bucket_bytes })
  return model
end

return M
