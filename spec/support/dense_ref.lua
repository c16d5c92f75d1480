-- Plain float64 references of the dense ops, and tensor helpers, for the dense specs.
-- Matrices are Lua lists, row-major and 1-based: m[(r - 1) * cols + c].
local ffi = require "ffi"
local ur = require "uvmrec"
local compare = require "uvmrec.compare"

local M = {}

-- x rounded to f32, as the engine's float arithmetic rounds each operation (-ffp-contract=off).
local F32 = ffi.new("float[1]")
function M.f32(x)
  F32[0] = x
  return F32[0]
end

-- A tensor of shape and dtype holding vals (rounded to the dtype), in placement.
function M.tensor(shape, vals, opts)
  opts = opts or {}
  local t = assert(ur.tensor(shape, { dtype = opts.dtype or "f32", placement = opts.placement }))
  local n = t:numel()
  if opts.dtype == nil or opts.dtype == "f32" then
    local buf = ffi.new("float[?]", math.max(n, 1))
    for i = 1, n do buf[i - 1] = vals[i] end
    assert(ur.C.ur_tensor_write(t.p, 0, n, buf) == 0)
  else
    for i = 1, n do t:set(i - 1, vals[i]) end
  end
  return t
end

-- n uniform numbers in [lo, hi), rounded to dtype (by drawing into a tensor of it).
function M.rand(shape, seed, opts)
  opts = opts or {}
  local t = ur.tensor(shape, { dtype = opts.dtype or "f32" })
  t:uniform(opts.lo or -1, opts.hi or 1, seed)
  if opts.placement and opts.placement ~= "host" then
    t = assert(t:to(opts.placement))
  end
  return t, t:totable()
end

function M.zeros(shape, opts)
  opts = opts or {}
  return assert(ur.tensor(shape, { dtype = opts.dtype or "f32", placement = opts.placement })):fill(0)
end

-- Largest |a - b| / max(1, |b|), and ||a - b|| / ||b||, over two lists (uvmrec.compare).
M.maxrel, M.normrel = compare.maxrel, compare.normrel

function M.close_norm(a, b, tol, what)
  local m = M.normrel(a, b)
  if m > tol then error(("%s: differs by %.3g in norm (tolerance %g)"):format(what or "values", m, tol), 2) end
end

function M.close(a, b, tol, what)
  local m = M.maxrel(a, b)
  if m > tol then error(("%s: differs by %.3g relative (tolerance %g)"):format(what or "values", m, tol), 2) end
end

-- y = act(x w^T + b): x [rows, n], w [out, n], b [out] or nil.
function M.linear(x, w, b, rows, n, out, act)
  local y = {}
  for r = 0, rows - 1 do
    for o = 0, out - 1 do
      local s = b and b[o + 1] or 0
      for k = 0, n - 1 do s = s + x[r * n + k + 1] * w[o * n + k + 1] end
      if act == "relu" and s < 0 then s = 0 end
      y[r * out + o + 1] = s
    end
  end
  return y
end

-- gx = g w, gw = g^T x, gb = column sums of g, where g = gy masked by y > 0 under relu.
function M.linear_back(x, w, y, gy, rows, n, out, act)
  local g = {}
  for i = 1, rows * out do g[i] = (act == "relu" and y[i] <= 0) and 0 or gy[i] end
  local gx, gw, gb = {}, {}, {}
  for r = 0, rows - 1 do
    for k = 0, n - 1 do
      local s = 0
      for o = 0, out - 1 do s = s + g[r * out + o + 1] * w[o * n + k + 1] end
      gx[r * n + k + 1] = s
    end
  end
  for o = 0, out - 1 do
    local sb = 0
    for r = 0, rows - 1 do sb = sb + g[r * out + o + 1] end
    gb[o + 1] = sb
    for k = 0, n - 1 do
      local s = 0
      for r = 0, rows - 1 do s = s + g[r * out + o + 1] * x[r * n + k + 1] end
      gw[o * n + k + 1] = s
    end
  end
  return gx, gw, gb, g
end

function M.sigmoid(v)
  if v >= 0 then return 1 / (1 + math.exp(-v)) end
  local e = math.exp(v)
  return e / (1 + e)
end

-- The dot interaction of rows of dense [rows, d] and emb [rows, T d].
function M.interaction(dense, emb, rows, T, d, self)
  local out, w = {}, d + (T + 1) * T / 2 + (self and T + 1 or 0)
  for r = 0, rows - 1 do
    local z = {}
    for k = 1, d do z[k] = dense[r * d + k] end
    for k = 1, T * d do z[d + k] = emb[r * T * d + k] end
    local o = r * w
    for k = 1, d do out[o + k] = z[k] end
    local p = o + d
    for i = 0, T do
      for j = 0, i - (self and 0 or 1) do
        local s = 0
        for k = 1, d do s = s + z[i * d + k] * z[j * d + k] end
        p = p + 1
        out[p] = s
      end
    end
  end
  return out, w
end

-- Gradients of sum(gout * interaction) with respect to dense and emb.
function M.interaction_back(dense, emb, gout, rows, T, d, self)
  local w = d + (T + 1) * T / 2 + (self and T + 1 or 0)
  local gd, ge = {}, {}
  for r = 0, rows - 1 do
    local z, gz = {}, {}
    for k = 1, d do z[k] = dense[r * d + k] end
    for k = 1, T * d do z[d + k] = emb[r * T * d + k] end
    for k = 1, (T + 1) * d do gz[k] = 0 end
    local p = r * w + d
    for i = 0, T do
      for j = 0, i - (self and 0 or 1) do
        p = p + 1
        local g = gout[p]
        for k = 1, d do
          gz[i * d + k] = gz[i * d + k] + g * z[j * d + k]
          gz[j * d + k] = gz[j * d + k] + g * z[i * d + k]
        end
      end
    end
    for k = 1, d do gd[r * d + k] = gz[k] + gout[r * w + k] end
    for k = 1, T * d do ge[r * T * d + k] = gz[d + k] end
  end
  return gd, ge
end

local function log1p(e)
  if e < 1e-5 then return e - e * e / 2 end
  return math.log(1 + e)
end

function M.bce(x, y, wt)
  local l = math.max(x, 0) - x * y + log1p(math.exp(-math.abs(x)))
  return wt and wt * l or l
end

-- The gradient of f() (which reads the list vals) by central differences, element by element.
function M.central_differences(f, vals)
  local h = require "helpers"
  local g = {}
  for i = 1, #vals do g[i] = h.central_difference(f, vals, i, 1e-6) end
  return g
end

-- Checks module m's forward against ref(inputs' values, parameters' values) (float64, in Lua)
-- and every gradient of sum(gout * output), of the inputs and of the parameters, against
-- central finite differences of ref.
function M.gradcheck(m, inputs, ref, tol)
  local fd = M.central_differences
  local input = #inputs == 1 and inputs[1] or inputs
  local xv = {}
  for i, x in ipairs(inputs) do xv[i] = x:totable() end
  local params = m:parameters()
  local pv = {}
  for i, p in ipairs(params) do pv[i] = p.tensor:totable() end
  local y = m:forward(input)
  M.close(y:totable(), ref(xv, pv), tol, "forward")
  local gout, gv = M.rand(y:size(), 999)
  m:zero_grad()
  local gi = m:backward(input, gout)
  local function loss()
    local out, s = ref(xv, pv), 0
    for i = 1, #out do s = s + out[i] * gv[i] end
    return s
  end
  if #inputs == 1 then gi = { gi } end
  for i = 1, #inputs do M.close(gi[i]:totable(), fd(loss, xv[i]), tol, "gradient of input " .. i) end
  for i, p in ipairs(params) do M.close(p.grad:totable(), fd(loss, pv[i]), tol, "gradient of " .. p.name) end
end

return M
