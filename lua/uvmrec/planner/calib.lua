-- Calibrations: the measured rates the planner's cost model divides by, as JSON files.
--
--   { "format": "uvmrec-calibration", "version": 1, "machine": "...", "backend": "cuda" | "cpu",
--     "date": "...", "command": "...", "commit": "...",
--     "rates": { "<name>": { "value": <number>, "unit": "<unit>", "measured": true | false,
--                            "source": "...", "command": "...", "date": "..." }, ... } }
--
-- Every rate says where it comes from; "measured": false marks a figure that is not a
-- measurement of this project (a data-sheet value), which the planner names when it uses it.
-- The rates (M.RATES below) are all required, except the collectives, which only plans over
-- several ranks need, and the terms a calibration may lack (its cost is then left out: 0): the
-- MLPs' costs per value and per layer, the step's fixed cost, the loader's, the hint
-- interval's and the cache's per batch and per distinct row.  Shipped:
-- calib/h200.json (`uvmrec calibrate` on one H200 with the data sheet's collectives:
-- scripts/bench/calib_h200.lua) and calib/cpu.json (`uvmrec calibrate` on the 2-core
-- development machine).
local json = require "uvmrec.json"

local M = {}

M.FORMAT, M.VERSION = "uvmrec-calibration", 1

-- name -> {unit, what, optional}
M.RATES = {
  hbm_copy = { "B/s", "copy within HBM, bytes read + written" },
  hbm_gather = { "B/s", "bytes of scattered rows read once each in HBM" },
  hbm_gather_repeat = { "B/s", "bytes of rows read again within a batch (on-chip caches)" },
  hbm_update = { "B/s", "bytes of scattered rows (with their optimizer state) read, stepped and written back" },
  host_to_device = { "B/s", "host (pinned) to device copy" },
  device_to_host = { "B/s", "device to host (pinned) copy" },
  zero_copy_gather = { "B/s", "bytes of scattered rows read in place from pinned host memory" },
  managed_gather = { "B/s", "bytes of scattered rows read in place from managed memory on the host" },
  zero_copy_update = { "B/s", "bytes of scattered rows updated in place in pinned host memory" },
  managed_update = { "B/s", "bytes of scattered rows updated in place in managed memory on the host" },
  tbe_backward_per_id = { "s", "fused backward: per id (sort, reduction, the step's work per value)" },
  hints_per_row = { "s", "a managed table's hint interval (hot_prefix, after its relayout): per row", true },
  cache_per_batch = { "s", "software cache: per batch a rank's cache prepares, whatever its size (launches, the "
                      .. "host's waits; absent: cache_per_id carries it)", true },
  cache_per_id = { "s", "software cache: per id looked up (the lookup's sorts; with cache_per_row, the decisions "
                   .. "per distinct row apart)" },
  cache_per_row = { "s", "software cache: per distinct row of a batch (decisions, placement; absent: cache_per_id "
                    .. "carries it)", true },
  cache_row_fixed = { "s", "software cache: per row moved, besides its bytes" },
  cache_move = { "B/s", "software cache: bytes of rows moved in and written back" },
  pipeline_overlap = { "fraction", "share of the cache's time the prefetch pipeline hides" },
  mlp_f32 = { "FLOP/s", "MLP forward + backward, f32 (6 x batch x sum of in x out)" },
  mlp_tf32 = { "FLOP/s", "MLP forward + backward, TF32" },
  mlp_bf16 = { "FLOP/s", "MLP forward + backward, bf16" },
  mlp_act_f32 = { "s", "MLP forward + backward, f32: per output value of a layer (bias, activation, their "
                  .. "gradients)", true },
  mlp_act_tf32 = { "s", "the same, TF32", true },
  mlp_act_bf16 = { "s", "the same, bf16", true },
  mlp_layer_f32 = { "s", "MLP forward + backward, f32: per layer (on the CPU the products' threading at batches "
                    .. "of 1024 and more; on a GPU the kernels' launches)", true },
  mlp_layer_tf32 = { "s", "the same, TF32", true },
  mlp_layer_bf16 = { "s", "the same, bf16", true },
  interaction_dot = { "FLOP/s", "dot interaction forward + backward (6 x batch x F(F-1)/2 x dim)" },
  step_overhead = { "s", "a training step's fixed cost (launches, calls) apart from its work", true },
  loader_per_value = { "s", "the synthetic loader: the wall time its batches add to a CPU step (on a GPU, its own "
                       .. "time a batch), per value (ids, dense features, label)", true },
  alltoall = { "B/s", "all-to-all, bytes each rank sends", true },
  allreduce = { "B/s", "all-reduce bus rate (ring: 2 (W-1)/W x bytes per rank)", true },
  reduce_scatter = { "B/s", "reduce-scatter bus rate ((W-1)/W x bytes per rank)", true },
}

M.COLLECTIVES = { alltoall = true, allreduce = true, reduce_scatter = true }

-- Beyond these a rate is no machine's (HBM reads a few TB/s, on-chip caches tens, tensor cores a
-- few PFLOP/s; a term of a second an id, row or layer is none's): only a fit that left its term
-- almost nothing of the time measured (`uvmrec calibrate` on a GPU once gave managed_update 16
-- PB/s) comes out there.
M.CEILING = { ["B/s"] = 1e14, ["FLOP/s"] = 1e16, s = 1, fraction = 1 }

-- nil when value is in range for rate `name` (a known one); else what is wrong, and what was
-- expected.
function M.check_value(name, value)
  local unit = M.RATES[name][1]
  if type(value) ~= "number" or value ~= value then return ("value %s is not a number"):format(tostring(value)) end
  local zero_ok = unit == "s" or unit == "fraction"
  if (zero_ok and value >= 0 or value > 0) and value < M.CEILING[unit] then return nil end
  return ("value %s is out of range for %s: expected %s and below %g"):format(value, unit, zero_ok and ">= 0" or "> 0",
         M.CEILING[unit])
end

local Calib = {}
Calib.__index = Calib
M.Calib = Calib

local function fail(where, msg) return nil, ("calibration %s: %s"):format(where, msg) end

-- A calibration from a decoded JSON table; nil, message naming the key when it is malformed.
function M.from_table(t, where)
  where = where or "(table)"
  if type(t) ~= "table" then return fail(where, "not a JSON object") end
  if t.format ~= M.FORMAT then
    return fail(where, ("format is %s; expected %q"):format(tostring(t.format), M.FORMAT))
  end
  if t.version ~= M.VERSION then
    return fail(where, ("version %s; this planner reads %d"):format(tostring(t.version), M.VERSION))
  end
  -- the backend decides the step's form, the hint pages, the arena's blocks and the dense
  -- workspaces (planner.setup, cost.step): a file without one, or of another spelling, was priced
  -- as a GPU's
  if t.backend ~= "cuda" and t.backend ~= "cpu" then
    return fail(where, ("backend is %s; expected \"cuda\" or \"cpu\""):format(
      type(t.backend) == "string" and ("%q"):format(t.backend) or tostring(t.backend)))
  end
  if type(t.rates) ~= "table" then return fail(where, "no rates") end
  for name in pairs(t.rates) do
    if not M.RATES[name] then return fail(where, ("rates.%s: unknown rate"):format(name)) end
  end
  local names = {}
  for name in pairs(M.RATES) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local spec, r = M.RATES[name], t.rates[name]
    if r == nil then
      if not spec[3] then return fail(where, ("rates.%s is missing (%s)"):format(name, spec[2])) end
    else
      if type(r) ~= "table" then return fail(where, ("rates.%s is not an object"):format(name)) end
      local bad = M.check_value(name, r.value)
      if bad then return fail(where, ("rates.%s.%s"):format(name, bad)) end
      if r.unit ~= spec[1] then
        return fail(where, ("rates.%s.unit is %s; expected %s"):format(name, tostring(r.unit), spec[1]))
      end
      if type(r.source) ~= "string" or r.source == "" then
        return fail(where, ("rates.%s has no source"):format(name))
      end
      -- "measured": false is what marks a data sheet's figure (Calib:unmeasured): "false" or "no"
      -- was taken as measured
      if r.measured ~= nil and type(r.measured) ~= "boolean" then
        return fail(where, ("rates.%s.measured is %s; expected true or false"):format(name,
          type(r.measured) == "string" and ("%q"):format(r.measured) or tostring(r.measured)))
      end
    end
  end
  return setmetatable({ data = t, where = where, machine = t.machine, backend = t.backend }, Calib)
end

function M.load(path)
  local text, err = require("uvmrec.lib").read_file(path)
  if not text then return nil, "calibration: " .. tostring(err) end
  local t, jerr = json.decode(text)
  if t == nil then return nil, ("calibration %s: %s"):format(path, tostring(jerr)) end
  return M.from_table(t, path)
end

-- The directory of the shipped calibrations.
function M.dir()
  local src = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
  return src .. "/calib"
end

-- A shipped calibration by name ("h200", "cpu") or a path.
function M.find(name)
  if name:match("%.json$") or name:find("/") then return M.load(name) end
  return M.load(M.dir() .. "/" .. name .. ".json")
end

function Calib:rate(name)
  local r = self.data.rates[name]
  if r == nil then
    if M.RATES[name] and M.RATES[name][3] then
      error(("calibration %s has no %s rate (%s)%s"):format(self.where, name, M.RATES[name][2],
            M.COLLECTIVES[name] and ": plans over several ranks need the collectives' rates" or ""), 2)
    end
    error("calibration: no rate " .. tostring(name), 2)
  end
  return r.value
end

function Calib:has(name) return self.data.rates[name] ~= nil end

-- An optional term's value, or 0 where this calibration lacks it (its cost left out).
function Calib:term(name)
  local spec = M.RATES[name]
  if not (spec and spec[3] and spec[1] == "s") then
    error(("calibration: %s is not an optional term in seconds"):format(tostring(name)), 2)
  end
  local r = self.data.rates[name]
  return r and r.value or 0
end

-- Rates used that are not measurements: {name = source}.
function Calib:unmeasured(names)
  local out = {}
  for _, n in ipairs(names) do
    local r = self.data.rates[n]
    if r and r.measured == false then out[#out + 1] = ("%s (%s)"):format(n, r.source) end
  end
  return out
end

function Calib:encode() return M.encode(self.data) end

-- JSON text, one rate a line (the canonical encoder, keys sorted).
function M.encode(t)
  local head = {}
  for k, v in pairs(t) do if k ~= "rates" then head[k] = v end end
  local names = {}
  for n in pairs(t.rates) do names[#names + 1] = n end
  table.sort(names)
  local lines = {}
  for i, n in ipairs(names) do
    lines[i] = ("    %s: %s"):format(json.encode(n), json.encode(t.rates[n]))
  end
  local h = json.encode(head)
  return h:sub(1, -2) .. ',\n  "rates": {\n' .. table.concat(lines, ",\n") .. "\n  }\n}\n"
end

-- x with N x = v, N square (rows of numbers), by Gaussian elimination with partial pivoting;
-- N and v are overwritten.  A singular N is an error naming the column.
function M.solve(N, v)
  local m = #v
  for a = 1, m do
    local piv = a
    for r = a + 1, m do if math.abs(N[r][a]) > math.abs(N[piv][a]) then piv = r end end
    local pv = math.abs(N[piv][a])
    if pv == 0 or pv ~= pv then
      error(("calib.solve: the system is singular (column %d has no pivot)"):format(a), 2)
    end
    N[a], N[piv], v[a], v[piv] = N[piv], N[a], v[piv], v[a]
    for r = a + 1, m do
      local f = N[r][a] / N[a][a]
      for b = a, m do N[r][b] = N[r][b] - f * N[a][b] end
      v[r] = v[r] - f * v[a]
    end
  end
  local x = {}
  for a = m, 1, -1 do
    local sum = v[a]
    for b = a + 1, m do sum = sum - N[a][b] * x[b] end
    x[a] = sum / N[a][a]
  end
  return x
end

-- Least squares, x minimising sum_i (sum_j A[i][j] x[j] - y[i])^2, or with `relative`,
-- sum_i (sum_j A[i][j] x[j] / y[i] - 1)^2 (each run's error in its own scale).  A coefficient
-- fitted below 0 is dropped (0) and the rest fitted again, until none is: no coefficient comes
-- out below 0 (a simple active set, not a full non-negative least squares: a dropped term is
-- not tried again).  A: rows of the terms' amounts, y: the measured times (> 0 when relative).
-- Returns the coefficients and the worst run's relative error, |fitted / measured - 1| (over the
-- runs not measured at 0, which an absolute fit may hold).
function M.fit(A, y, relative)
  local n = #A[1]
  if relative then
    for i = 1, #y do
      if y[i] ~= y[i] or y[i] <= 0 then
        error(("calib.fit: run %d measured %s; expected a time > 0"):format(i, tostring(y[i])), 2)
      end
    end
  end
  local on = {}
  for j = 1, n do on[j] = true end
  while true do
    local idx = {}
    for j = 1, n do if on[j] then idx[#idx + 1] = j end end
    local m = #idx
    if m == 0 then error("calib.fit: no term can be fitted with a coefficient >= 0", 2) end
    local N, v = {}, {}
    for a = 1, m do
      N[a], v[a] = {}, 0
      for b = 1, m do N[a][b] = 0 end
    end
    for i = 1, #A do
      local w = relative and 1 / y[i] or 1
      for a = 1, m do
        local ra = A[i][idx[a]] * w
        v[a] = v[a] + ra * y[i] * w
        for b = 1, m do N[a][b] = N[a][b] + ra * A[i][idx[b]] * w end
      end
    end
    local x = M.solve(N, v)
    local worst
    for a = 1, m do if x[a] < 0 and (not worst or x[a] < x[worst]) then worst = a end end
    if not worst then
      local out = {}
      for j = 1, n do out[j] = 0 end
      for a = 1, m do out[idx[a]] = x[a] end
      local off = 0
      for i = 1, #A do
        local fitted = 0
        for j = 1, n do fitted = fitted + A[i][j] * out[j] end
        if y[i] ~= 0 then off = math.max(off, math.abs(fitted / y[i] - 1)) end
      end
      return out, off
    end
    on[idx[worst]] = false
  end
end

-- A calibration for specs and experiments: every rate at `value` unless given; priced as a GPU's
-- (backend "cuda").
function M.synthetic(rates)
  local t = { format = M.FORMAT, version = M.VERSION, machine = "synthetic", backend = "cuda", rates = {} }
  for name, spec in pairs(M.RATES) do
    local v = rates and rates[name]
    if v == nil and not spec[3] then v = spec[1] == "fraction" and 0 or spec[1] == "s" and 1e-9 or 1e10 end
    if v then t.rates[name] = { value = v, unit = spec[1], source = "synthetic", measured = false } end
  end
  return assert(M.from_table(t, "(synthetic)"))
end

return M
