-- Synthetic data with a learnable signal.  A spec is a preset name or a table:
--   { num_dense = 13, seed = 1, bias = -1.2, dense_signal = 0.08, signal_total = 2.6,
--     groups = 0, drift = 0 (ranks the hot ids move a sample), id_space_factor = nil,
--     tables = { { name = "C1", rows = 1000, zipf = 1.05 (0: uniform), hot = 1 | {min, max},
--                  weighted = false, signal = nil, id_space = nil }, ... } }
-- Labels come from a hidden logistic model: per table, each id has a fixed random effect
-- (std `signal`, by default signal_total / sqrt(tables)); the dense features add a small part.
-- id_space: ids are drawn from [0, id_space) rather than [0, rows) (raw ids, for managed
-- collisions; the loader takes them modulo rows where it is given rows); id_space_factor sets
-- it to that many times rows for tables without their own.  drift: sample i's Zipf rank r is
-- the undrifted rank r + floor(i drift), modulo the id space (every id climbs a rank each
-- 1/drift samples: ids never seen rise into the hot set, the hottest leave it), in every table.
local ffi = require "ffi"
local lib = require "uvmrec.lib"
local tensor = require "uvmrec.tensor"
local presets = require "uvmrec.data.presets"
local C, check = lib.C, lib.check

local M = {}

-- the engine's bound (uvmrec.h's UR_SYNTH_MAX_TABLES)
local MAX_TABLES = 65536
-- each spec struct's tables array, kept alive by the struct
local held_tables = setmetatable({}, { __mode = "k" })

local function copy(t)
  if type(t) ~= "table" then return t end
  local o = {}
  for k, v in pairs(t) do o[k] = copy(v) end
  return o
end

local SPEC_KEYS = { "name", "num_dense", "seed", "bias", "dense_signal", "signal_total", "groups", "drift",
                    "id_space_factor", "tables" }
local TABLE_KEYS = { "name", "rows", "zipf", "hot", "weighted", "signal", "id_space" }

-- what a checked spec holds too
local SPEC_ALSO = { hot_max = true, cspec = true }

-- The spec as a Lua table (a preset's copy, with overrides) and as the engine's struct.
function M.spec(s, overrides, level)
  level = level or 2
  if type(s) == "string" then
    local p = presets[s]
    if type(p) ~= "table" or not p.tables then
      error(("synthetic: no preset '%s'; presets are %s"):format(s, table.concat(presets.names, ", ")), level + 1)
    end
    s = p
  end
  if type(s) ~= "table" then error("synthetic: expected a preset name or a spec table", level + 1) end
  s = copy(s)
  for k, v in pairs(overrides or {}) do s[k] = v end
  -- A misspelt key would leave its setting at the default, and a cast would read 1.5 rows as 1.
  lib.known_keys(s, SPEC_KEYS, "synthetic", level + 1, "key", SPEC_ALSO)
  for _, k in ipairs { "num_dense", "seed", "groups" } do
    if s[k] ~= nil then lib.element(s[k], "i64", "synthetic: " .. k, nil, level + 1) end
  end
  local factor = s.id_space_factor
  if factor ~= nil and not (type(factor) == "number" and factor >= 0 and factor < math.huge) then
    error(("synthetic: id_space_factor is %s; expected a number >= 0 (ids drawn from that many times each "
      .. "table's rows; 0: the rows)"):format(tostring(factor)), level + 1)
  end
  local tabs = s.tables or {}
  if #tabs > MAX_TABLES then
    error(("synthetic: %d tables; expected at most %d"):format(#tabs, MAX_TABLES), level + 1)
  end
  for i, t in ipairs(tabs) do
    if type(t) ~= "table" then error(("synthetic: table %d is %s; expected a table"):format(i, type(t)), level + 1) end
    local what = ("synthetic: table %d"):format(i)
    lib.known_keys(t, TABLE_KEYS, what, level + 1, "key")
    if type(t.rows) == "number" then lib.element(t.rows, "i64", what .. " rows", nil, level + 1) end
    if t.id_space ~= nil then lib.element(t.id_space, "i64", what .. " id_space", nil, level + 1) end
    local hot = type(t.hot) == "table" and t.hot or { t.hot }
    for k, v in pairs(hot) do lib.element(v, "i32", ("%s hot[%s]"):format(what, tostring(k)), nil, level + 1) end
  end
  local c = ffi.new("ur_synth_spec")
  -- the struct points at its tables: they live as long as the struct does
  local ctabs = ffi.new("ur_synth_table[?]", math.max(#tabs, 1))
  held_tables[c] = ctabs
  c.tables = ctabs
  c.num_tables = #tabs
  c.num_dense = s.num_dense or 13
  c.seed = s.seed or 0
  c.bias = s.bias or -1.2
  c.dense_signal = s.dense_signal or 0.08
  c.groups = s.groups or 0
  c.drift = s.drift or 0
  local default_signal = (s.signal_total or 2.6) / math.sqrt(math.max(#tabs, 1))
  s.hot_max = {}
  for i, t in ipairs(tabs) do
    local ct = ctabs[i - 1]
    if type(t.rows) ~= "number" then error(("synthetic: table %d has no rows"):format(i), level + 1) end
    ct.rows = t.rows
    ct.zipf = t.zipf or 0
    local hot = t.hot or 1
    if type(hot) == "table" then
      ct.hot_min, ct.hot_max = hot[1] or hot.min, hot[2] or hot.max
    else
      ct.hot_min, ct.hot_max = hot, hot
    end
    ct.weighted = t.weighted and 1 or 0
    ct.signal = t.signal or default_signal
    local space = t.id_space or (factor and math.floor(factor * t.rows + 0.5)) or 0
    -- the product itself, not what its cast to int64_t makes of it; nor 0, which reads as the rows
    if not t.id_space and factor and factor > 0 and (space > 2 ^ 40 or space < 1) then
      error(("synthetic: table %d's id space, id_space_factor %.17g x %.17g rows, is %.17g; expected 1 to 2^40")
        :format(i, factor, t.rows, space), level + 1)
    end
    ct.id_space = space
    t.name = t.name or ("C" .. i)
    s.hot_max[i] = ct.hot_max
  end
  lib.must(C.ur_synth_check(c), level + 1)
  s.num_dense = c.num_dense
  s.cspec = c
  return s
end

-- Samples first .. first+n-1: {dense, labels, ids [n, H], lengths [n, T], weights, groups,
-- probs} in one placement (host by default).
function M.generate(s, first, n, opts)
  opts = opts or {}
  if not (type(s) == "table" and s.cspec) then s = M.spec(s, nil, 2) end
  lib.element(first, "i64", "synthetic: first", nil, 2)
  if lib.element(n, "i64", "synthetic: samples", nil, 2) < 0 then
    error(("synthetic: samples is %s; expected a whole number >= 0"):format(tostring(n)), 2)
  end
  local c = s.cspec
  local H = 0
  for i = 0, c.num_tables - 1 do H = H + c.tables[i].hot_max end
  local weighted = false
  for i = 0, c.num_tables - 1 do weighted = weighted or c.tables[i].weighted ~= 0 end
  local t = { placement = opts.placement or "host" }
  local function new(shape, dtype)
    t.dtype = dtype
    return assert(tensor.tensor(shape, t))
  end
  local out = {
    dense = new({ n, c.num_dense }, "f32"), labels = new({ n }, "f32"), ids = new({ n, H }, "i64"),
    lengths = new({ n, c.num_tables }, "i32"),
    weights = weighted and new({ n, H }, "f32") or nil,
    groups = c.groups > 0 and new({ n }, "i64") or nil,
    probs = opts.probs and new({ n }, "f32") or nil,
  }
  local function p(x) return x and x.p or nil end
  local ok, err = check(C.ur_synth_generate(nil, c, first, n, out.dense.p, out.labels.p, out.ids.p,
    p(out.weights), out.lengths.p, p(out.groups), p(out.probs)), 2)
  if not ok then return nil, err end
  return out
end

-- The `synthetic:` section of a YAML config (model configs embed this schema).
function M.schema()
  local cfg = require "uvmrec.config"
  return cfg.map {
    preset = cfg.enum(presets.names), seed = cfg.int { min = 0 }, num_dense = cfg.int { min = 0, max = 4096 },
    bias = cfg.number {}, dense_signal = cfg.number { min = 0 }, signal_total = cfg.number { min = 0 },
    groups = cfg.int { min = 0 }, samples = cfg.int { min = 0 }, drift = cfg.number { min = 0 },
    id_space_factor = cfg.number { min = 0 },
    tables = cfg.list(cfg.map({
      name = cfg.string {}, rows = cfg.int { min = 1 }, zipf = cfg.number { min = 0 },
      hot = cfg.int { min = 1 }, hot_min = cfg.int { min = 0 }, hot_max = cfg.int { min = 1 },
      weighted = cfg.bool {}, signal = cfg.number { min = 0 },
      id_space = cfg.int { min = 1 },
    }, { required = { "rows" } })),
  }
end

-- A spec from a loaded `synthetic:` section: its preset (if any) with the section's values.
function M.from_config(sec)
  local base = sec.preset and copy(presets[sec.preset]) or { tables = {} }
  for k, v in pairs(sec) do
    if k ~= "preset" and k ~= "tables" and k ~= "samples" then base[k] = v end
  end
  if sec.tables then
    base.tables = {}
    for i, t in ipairs(sec.tables) do
      local hot = t.hot or 1
      if t.hot_min or t.hot_max then hot = { t.hot_min or 1, t.hot_max or t.hot_min or 1 } end
      base.tables[i] = { name = t.name, rows = t.rows, zipf = t.zipf or 1.05, hot = hot,
                         weighted = t.weighted, signal = t.signal, id_space = t.id_space }
    end
  end
  return base
end

-- A spec from a preset name, a .lua file returning a spec, or a YAML file with a `synthetic:`
-- section.  Returns the spec table (not yet checked) or nil, message.
function M.resolve(name)
  if presets[name] and presets[name].tables then return copy(presets[name]) end
  if name:match("%.lua$") then
    local chunk, err = loadfile(name)
    if not chunk then return nil, err end
    local ok, spec = pcall(chunk)
    if not ok then return nil, spec end
    return spec
  end
  if name:match("%.ya?ml$") then
    local cfg = require "uvmrec.config"
    local c, err = cfg.load(name, cfg.map { synthetic = M.schema() })
    if not c then return nil, err end
    if not c.synthetic then return nil, name .. ": no synthetic: section" end
    return M.from_config(c.synthetic), c.synthetic.samples
  end
  return nil, ("'%s' is neither a preset (%s) nor a .lua or .yaml file"):format(name, table.concat(presets.names, ", "))
end

-- The hidden model's AUC on n samples from first: the ceiling any model can reach.
function M.hidden_auc(s, n, first)
  local g = assert(M.generate(s, first or 0, n, { probs = true }))
  return require("uvmrec.data").auc(g.probs:totable(), g.labels:totable())
end

return M
