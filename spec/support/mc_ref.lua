-- A plain reference of managed collisions (uvmrec.h, "managed collisions"): Lua tables for the
-- maps, the rules written out directly, float64 for scores (the exp and log of distance_lfu as
-- the engine computes them, IEEE-exact).  map.new(cfg) takes uvmrec.mc.new's options (tables
-- with rows, features and settings; features; seed); remap(batch, update) takes a batch as
-- {feature = {bag = {ids...}}} per feature in order, with an optional samples-per-bag list.
local ffi = require "ffi"
local bit = require "bit"
local mc = require "uvmrec.mc"

local M = {}
local U = ffi.typeof("uint64_t")
local ONE = 65536

local function mix(x)
  x = bit.bxor(x, bit.rshift(x, 30))
  x = x * 0xBF58476D1CE4E5B9ULL
  x = bit.bxor(x, bit.rshift(x, 27))
  x = x * 0x94D049BB133111EBULL
  return bit.bxor(x, bit.rshift(x, 31))
end

local function u64(id) return ffi.cast("uint64_t", ffi.cast("int64_t", id)) end

-- The engine's exp and log (data/synth.h): polynomials in IEEE double, no libm.
local function eexp(x)
  if x > 700 then x = 700 end
  if x < -700 then return 0 end
  local kf = math.floor(x * 1.4426950408889634 + 0.5)
  local r = (x - kf * 0.6931471803691238) - kf * 1.9082149292705877e-10
  local p = 1.6059043836821613e-10
  for _, c in ipairs { 2.08767569878681e-09, 2.505210838544172e-08, 2.755731922398589e-07,
                       2.7557319223985893e-06, 2.48015873015873e-05, 1.984126984126984e-04,
                       1.388888888888889e-03, 8.333333333333333e-03, 4.1666666666666664e-02,
                       1.6666666666666666e-01, 0.5, 1.0, 1.0 } do
    p = p * r + c
  end
  return p * math.ldexp(1, kf)
end

local function elog(x)
  local m, e = math.frexp(x) -- x = m 2^e, m in [0.5, 1)
  m, e = m * 2, e - 1
  if m > 1.4142135623730951 then
    m = m * 0.5
    e = e + 1
  end
  local f = (m - 1.0) / (m + 1.0)
  local f2 = f * f
  local p = 1.0 / 25
  for _, d in ipairs { 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3 } do p = p * f2 + 1.0 / d end
  p = p * f2 + 1.0
  return e * 0.6931471803691238 + e * 1.9082149292705877e-10 + 2.0 * (f * p)
end
M.exp, M.log = eexp, elog

local function score(s, counts, window, last, now)
  if s.policy == "lru" then return last * 1048576 + math.min(window, 1048575) end
  local c = counts + window * ONE
  if s.policy == "lfu" then return c end
  local age = now > last and now - last or 0
  local d = 1 + age
  if s.distance_power == 1 then return c / d end
  return c / eexp(s.distance_power * elog(d))
end
M.score = score

local function better(a, b) return a.score > b.score or (a.score == b.score and a.id < b.id) end
local function decayed(counts, window, decay) return math.floor((counts + window * ONE) * decay) end

local Map = {}
Map.__index = Map

function M.new(cfg)
  local self = setmetatable({ tables = {}, by_name = {}, features = {}, step = 0 }, Map)
  local seed = U(cfg.seed or 0)
  local on = {}
  for i, t in ipairs(cfg.tables) do
    local s = mc.settings(t, cfg, t.rows)
    local tb = { name = t.name, rows = t.rows, s = s, cap = t.rows - s.fallback_rows,
                 fallback = s.fallback_rows, seed = bit.bxor(seed, U(i) * 0xD1B54A32D192ED03ULL),
                 ids = {}, counts = {}, window = {}, last = {}, row_of = {}, occ = 0, cand = {},
                 ncand = 0, lookups = 0, resident = 0, fb = 0, rounds = 0, fills = 0,
                 admissions = 0, evictions = 0, reassigned = {} }
    self.tables[i], self.by_name[t.name] = tb, tb
    for _, f in ipairs(t.features or { t.name }) do
      on[f] = tb
      self.features[#self.features + 1] = f
    end
  end
  if cfg.features then self.features = { unpack(cfg.features) } end
  self.table_of = {}
  for i, f in ipairs(self.features) do self.table_of[i] = on[f] end
  return self
end

function M.fallback_row(tb, id)
  local h = mix(bit.bxor(u64(id), tb.seed, 0x5851F42D4C957F2DULL))
  return tb.cap + tonumber(h % U(tb.fallback))
end

-- A round of table tb at step now; returns the rows reassigned, ascending.
function Map:round(tb, evict)
  local now, s = self.step, tb.s
  local cands = {}
  for id, c in pairs(tb.cand) do
    cands[#cands + 1] = { id = id, count = c.count, last = c.last, score = score(s, 0, c.count, c.last, now) }
  end
  table.sort(cands, better)
  local nc, occ = #cands, tb.occ
  local ep = math.min(nc, tb.cap - occ)
  local m = (evict and nc > ep) and math.min(nc - ep, occ) or 0
  local res = {}
  if m > 0 then
    for row = 0, occ - 1 do
      res[#res + 1] = { id = tb.ids[row], row = row,
                        score = score(s, tb.counts[row], tb.window[row], tb.last[row], now) }
    end
    table.sort(res, function(a, b) return better(b, a) end) -- worst first
  end
  local ev = 0
  while ev < m and better(cands[ep + ev + 1], res[ev + 1]) do ev = ev + 1 end
  local freed = {}
  for j = 1, ev do freed[j] = res[j].row end
  table.sort(freed)
  for j = 1, ev do tb.row_of[tb.ids[freed[j]]] = nil end
  if evict then
    for row = 0, occ - 1 do
      tb.counts[row] = decayed(tb.counts[row], tb.window[row], s.decay)
      tb.window[row] = 0
    end
  end
  for j = 1, ep + ev do
    local row = j <= ev and freed[j] or occ + (j - ev - 1)
    local c = cands[j]
    tb.ids[row] = c.id
    -- a fill keeps the lookups as lookups since the last eviction round (lru's ties read them)
    tb.counts[row] = evict and decayed(0, c.count, s.decay) or 0
    tb.window[row] = evict and 0 or c.count
    tb.last[row] = c.last
    tb.row_of[c.id] = row
  end
  local left = {}
  if not evict then
    for j = ep + ev + 1, nc do left[cands[j].id] = { count = cands[j].count, last = cands[j].last } end
  end
  tb.cand, tb.ncand = left, evict and 0 or nc - ep - ev
  tb.occ = occ + ep
  tb.admissions, tb.evictions = tb.admissions + ep + ev, tb.evictions + ev
  if evict then tb.rounds = tb.rounds + 1 else tb.fills = tb.fills + 1 end
  return freed
end

-- batch: per feature (in order) a list of bags (lists of ids); mult (optional): per feature a
-- list of samples per bag (VBE).  Returns the rows, feature by feature and bag by bag, flat.
function Map:remap(batch, update, mult)
  if update then
    for _, tb in ipairs(self.tables) do
      tb.reassigned = {}
      local s = tb.s
      if (self.step > 0 and self.step % s.evict_every == 0) or tb.ncand >= s.max_candidates then
        tb.reassigned = self:round(tb, true)
      elseif s.fill and tb.occ < tb.cap and tb.ncand > 0 then
        tb.reassigned = self:round(tb, false)
      end
    end
  end
  local step, out = self.step + 1, {}
  for f, bags in ipairs(batch) do
    local tb = self.table_of[f]
    for b, bag in ipairs(bags) do
      local k = mult and mult[f][b] or 1
      for _, id in ipairs(bag) do
        if not tb then
          out[#out + 1] = id
        else
          local row = id ~= -1 and tb.row_of[id] or nil
          local count = update and k > 0
          if row then
            out[#out + 1] = row
            if count then
              tb.window[row] = tb.window[row] + k
              tb.last[row] = step
              tb.resident = tb.resident + k
            end
          else
            out[#out + 1] = M.fallback_row(tb, id)
            if count then
              tb.fb = tb.fb + k
              if id ~= -1 then
                local c = tb.cand[id]
                if not c then
                  c = { count = 0, last = 0 }
                  tb.cand[id] = c
                  tb.ncand = tb.ncand + 1
                end
                c.count, c.last = c.count + k, step
              end
            end
          end
          if count then tb.lookups = tb.lookups + k end
        end
      end
    end
  end
  if update then self.step = step end
  return out
end

-- The state as uvmrec.mc's state() gives it, in plain lists.
function Map:state(name)
  local tb = self.by_name[name]
  local st = { ids = {}, counts = {}, window = {}, last = {}, cand_ids = {}, cand_counts = {}, cand_last = {} }
  for row = 0, tb.cap - 1 do
    st.ids[row + 1] = tb.ids[row] or -1
    st.counts[row + 1] = tb.counts[row] or 0
    st.window[row + 1] = tb.window[row] or 0
    st.last[row + 1] = tb.last[row] or 0
  end
  local ids = {}
  for id in pairs(tb.cand) do ids[#ids + 1] = id end
  table.sort(ids)
  for i, id in ipairs(ids) do
    st.cand_ids[i], st.cand_counts[i], st.cand_last[i] = id, tb.cand[id].count, tb.cand[id].last
  end
  return st
end

function Map:stats(name)
  local tb = self.by_name[name]
  return { resident = tb.occ, capacity = tb.cap, candidates = tb.ncand, lookups = tb.lookups,
           resident_lookups = tb.resident, fallback_lookups = tb.fb, rounds = tb.rounds, fills = tb.fills,
           admissions = tb.admissions, evictions = tb.evictions }
end

-- A KJT-shaped input of a batch in the form remap takes: {keys, values, lengths}.
function M.kjt_fields(keys, batch)
  local values, lengths = {}, {}
  for _, bags in ipairs(batch) do
    for _, bag in ipairs(bags) do
      lengths[#lengths + 1] = #bag
      for _, id in ipairs(bag) do values[#values + 1] = id end
    end
  end
  return { keys = keys, values = values, lengths = lengths }
end

return M
