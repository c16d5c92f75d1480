-- uvmrec.nn.Module: the base class of every module, after torch7's nn.Module.
--
-- A module computes `output = forward(input)` through its updateOutput, and
-- `gradInput = backward(input, gradOutput)` through updateGradInput (the gradient with respect
-- to its input) and accGradParameters (which adds into its parameters' gradients: zero_grad
-- clears them).  Subclasses are made with Module:extend and built by calling the class:
--
--   local Scale = Module:extend("Scale")
--   function Scale:__init(n) Module.__init(self); self:register_parameter("weight", {n}) end
--   function Scale:updateOutput(input) ... return self.output end
--   local m = Scale(4)
--
-- Parameters are registered by name (register_parameter), so parameters(), zero_grad(),
-- to(placement) and set_precision() work for every module without code of its own.
-- Activations and workspaces come from the model's arena through self:buffer(), so a training
-- step allocates nothing once the largest batch has been seen.
local lib = require "uvmrec.lib"
local ur_tensor = require "uvmrec.tensor"

local Module = { __typename = "Module" }
Module.__index = Module

local PLACEMENTS = { host = true, pinned = true, device = true, managed = true }
local PRECISIONS = { f32 = true, tf32 = true, bf16 = true }

local function construct(cls, ...)
  local self = setmetatable({}, cls)
  self:__init(...)
  return self
end

-- A subclass named `name` (shown by tostring); its instances are made by calling it.
function Module:extend(name)
  if type(name) ~= "string" or name == "" then
    error("Module:extend: expected a class name, got " .. tostring(name), 2)
  end
  local cls = { __typename = name, super = self }
  cls.__index = cls
  cls.__tostring = Module.__tostring
  return setmetatable(cls, { __index = self, __call = construct })
end

-- True when module is an instance of cls or of one of its subclasses.
function Module.is(module, cls)
  if type(module) ~= "table" then return false end
  local c = getmetatable(module)
  while c do
    if c == cls then return true end
    c = c.super
  end
  return false
end

function Module:__init()
  self.output = nil
  self.gradInput = nil
  self.train = true
  self.placement = "host"
  self.device = -1
  self.precision = "f32"
  self._params = {}   -- {name, field, grad_field, half_field} in registration order
  self._bufs = {}
end

function Module:type_name() return getmetatable(self).__typename end

-- A module's options: opts (nil: {}), a table whose every key is in `known` (name -> the Lua
-- type its value takes); else an error at `level` naming the module, the key or value and what
-- it takes (an option misspelt, or a string where a boolean goes, was ignored or taken as true).
function Module.options(who, opts, known, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    local names = {}
    for k in pairs(known) do names[#names + 1] = k end
    table.sort(names)
    error(("%s: options must be a table (of %s), got %s"):format(who, table.concat(names, ", "), tostring(opts)),
          level + 1)
  end
  lib.known_keys(opts, known, who, level + 1)
  return opts
end

-- Seeds for parameter initialisation: each module built takes the next, so a model built
-- after manual_seed(s) is the same every time, on every backend.  A seed is a whole number below
-- Module.MAX_SEED (1.5 drew seed 1's numbers, the cast truncating; the seeds are made
-- modulo 2^52, so seeds 2^52 apart, 0 and 2^60 among them, built the same model); the seeds
-- handed out stay below Module.MAX_SEED + 1, so a module's seed + a few is exact (Linear's
-- bias, CrossNet's layers).
local ffi = require "ffi"
Module.MAX_SEED = 2 ^ 52
local seed_base, seed_count = ffi.new("uint64_t", 0x5eed), 0
function Module.manual_seed(s)
  lib.whole(s, "manual_seed: seed", 2, 0, Module.MAX_SEED - 1)
  seed_base, seed_count = ffi.new("uint64_t", s), 0
end
function Module.next_seed()
  seed_count = seed_count + 1
  -- exact in 64 bits (wrapping), the same numbers as before for the seeds whose products fit
  return tonumber((seed_base * 1000003 + seed_count * 7919) % (2 ^ 52 + 0ULL))
end

-- A module's `seed` option, checked (level: as its caller's error): nil takes the next seed.
function Module.seed_option(who, seed, level)
  if seed == nil then return Module.next_seed() end
  lib.whole(seed, who .. ": seed", level + 1, 0, Module.MAX_SEED)
  return seed
end

local DTYPE_NAMES = { [0] = "f32", "bf16", "f16", "i8", "u8", "i32", "i64", "f64" }
-- A tensor's dtype name without building a string (hot paths).
function Module.dtype_of(t)
  return DTYPE_NAMES[tonumber(lib.C.ur_tensor_dtype(lib.ptr(t, "tensor", 2)))]
end

-- Rows of a tensor (its first size) and the elements per row (of a tensor of no rows too).
function Module.rows_cols(t)
  local p = lib.ptr(t, "tensor", 2)
  local rows = tonumber(lib.C.ur_tensor_dim(p, 0))
  if rows > 0 then return rows, tonumber(lib.C.ur_tensor_numel(p)) / rows end
  local cols = 1
  for i = 1, tonumber(lib.C.ur_tensor_ndim(p)) - 1 do cols = cols * tonumber(lib.C.ur_tensor_dim(p, i)) end
  return rows, cols
end

-- t when it is a tensor; else an error at level naming the module and the argument (what:
-- "input", "gradOutput"): "Linear(4 -> 3): input is nil; expected a tensor" (a nil input failed
-- in the engine's words, "tensor: expected a handle, got a nil", or with Lua's own).
local is_tensor = ur_tensor.is_tensor
function Module:tensor_arg(t, what, level)
  if is_tensor(t) then return t end
  error(("%s: %s is %s; expected a tensor"):format(tostring(self), what, type(t) == "table" and "a table" or
        tostring(t)), level + 1)
end

-- out = fn(...), an op on the module's tensors (a dense op, an embedding collection's call); its
-- error, raised or returned as nil, err, is raised again at level (as error's, from the caller of
-- op) with the module in front, without the "file:line: " the op put there, as tensor_arg's and
-- Sequential's are: "Interaction: interaction forward: emb has 10 columns; expected T * 4 (...)"
-- (the op's message alone named no module, at a line of the module's file).
function Module:op(level, fn, ...)
  local ok, out, err = pcall(fn, ...)
  if ok and (out ~= nil or err == nil) then return out end
  error(("%s: %s"):format(tostring(self), (tostring(ok and err or out):gsub("^[^\n]-:%d+: ", ""))), level + 1)
end

local ARG_NAMES = { input = "input", gy = "gradOutput" }

-- input itself when it has the dtype of this module's activations, else a copy converted into
-- buffer `key` (an f32 batch entering a bf16 model; "input" or "gy", the gradient given to
-- backward).  A dtype the activations do not take is an error naming the module, raised where
-- the module's forward or backward was called: "Linear(4 -> 3): input is i32 [2, 4]; expected
-- f32 or bf16" (it was the cast's, "dense cast: src is i32 [2, 4]; ...").
function Module:as_act(input, key)
  local dt = self:act_dtype()
  local idt = Module.dtype_of(input)
  if idt == dt then return input end
  if idt ~= "f32" and idt ~= "bf16" then
    -- as_act, the module's updateOutput or _backward, the line that called forward or backward
    -- (whose tail call to those left no frame)
    error(("%s: %s is %s [%s]; expected f32 or bf16"):format(tostring(self), ARG_NAMES[key] or key, idt,
          table.concat(input:size(), ", ")), 3)
  end
  local rows, cols = Module.rows_cols(input)
  return require("uvmrec.dense").cast(input, self:buffer(key, dt, rows, cols), self.stream)
end

local PLACE_NAMES = { [0] = "host", "pinned", "device", "managed" }
-- A module without parameters works where its input is: used on its own it follows the input's
-- placement, with a fresh arena there (in a model, to() has placed it already).
function Module:follow(input)
  if #self._params > 0 then return end
  local p = input.p
  local place = PLACE_NAMES[tonumber(lib.C.ur_tensor_place(p))]
  if place ~= self.placement then
    self.placement, self.device = place, tonumber(lib.C.ur_tensor_device(p))
    self._arena, self._bufs = nil, {}
  end
end

-- Every module of the tree runs its work on `stream` (nil: the default stream).
local function set_stream(m, stream) m.stream = stream end
function Module:set_stream(stream)
  return self:apply(set_stream, stream)
end

-- ---- the protocol ----

function Module:updateOutput(input) -- luacheck: ignore 212
  error(self:type_name() .. " has no updateOutput", 2)
end

function Module:updateGradInput(input, gradOutput) -- luacheck: ignore 212
  error(self:type_name() .. " has no updateGradInput", 2)
end

function Module:accGradParameters(input, gradOutput) end -- luacheck: ignore 212

-- updateGradInput for a module whose input has no gradient (ids: the embedding collections and
-- the managed-collision map): gradInput is nil.
function Module:no_grad_input(input, gradOutput) -- luacheck: ignore 212
  self.gradInput = nil
  return nil
end

-- Arguments after the input (and gradOutput) go on to the update functions: a module may take
-- more (the embedding collections' batch ticket).
function Module:forward(input, ...)
  return self:updateOutput(input, ...)
end

function Module:backward(input, gradOutput, ...)
  self:updateGradInput(input, gradOutput, ...)
  self:accGradParameters(input, gradOutput, ...)
  return self.gradInput
end

-- ---- children ----

-- Containers keep their children in self.modules, as torch7's do.
function Module:children() return self.modules or {} end

-- Calls fn(module, ...) on this module and every module below it, parents first.  The calls
-- here give fn what it needs as arguments, with fn made once in this file, not as a closure
-- made per call: LuaJIT compiles a function called on a hot path into a trace as a constant, so
-- the trace (which lives on, until it is flushed) would keep a closure's upvalues alive, an
-- arena or the model with them, after the model is gone (docs/results.md: the memory held
-- after a run).
function Module:apply(fn, ...)
  fn(self, ...)
  for _, m in ipairs(self:children()) do m:apply(fn, ...) end
  return self
end

local function set_train(m, on) m.train = on end
function Module:training()
  return self:apply(set_train, true)
end

function Module:evaluate()
  return self:apply(set_train, false)
end

-- ---- parameters ----

local function place_opts(self)
  return { placement = self.placement, device = self.placement ~= "host" and self.placement ~= "pinned"
           and self.device or nil }
end

-- The most elements a parameter holds: an f32 tensor of the engine's largest (uvmrec.h's
-- UR_TENSOR_MAX_BYTES_LOG2).
Module.MAX_PARAM_ELEMENTS = 2 ^ lib.C.UR_TENSOR_MAX_BYTES_LOG2 / 4

-- Refuses, before anything is allocated, a parameter of n elements that no tensor holds, naming
-- the arguments that make it (fmt and its values, formatted only then: "in %.0f and out %.0f"):
-- "<who>: in 4611686018427387904 and out 3: a weight [out, in] of 13835058055282163712
-- elements; expected at most 281474976710656 (2^50 bytes of f32)" at level.
function Module.check_elements(who, n, param, level, fmt, ...)
  if n <= Module.MAX_PARAM_ELEMENTS then return end
  error(("%s: %s: a %s of %.0f elements; expected at most %.0f (2^%d bytes of f32)"):format(who, fmt:format(...),
        param, n, Module.MAX_PARAM_ELEMENTS, lib.C.UR_TENSOR_MAX_BYTES_LOG2), level + 1)
end

-- Host allocations of fewer bytes are made without asking the host first.
Module.HOST_CHECK_BYTES = 2 ^ 26

-- Whether `bytes` more of `placement` fit in what the host can still give
-- (uvmrec.host_memory.available; device and managed memory are not asked): true, or nil and
-- "<bytes> (<GiB>) but the host has ...".  Memory the kernel promised (malloc succeeds where
-- overcommit allows) was taken by the fills that follow, and the OOM killer ended the process
-- (Linear(65536, 65536): 32 GiB with its gradient, on a host of 24 GiB).
local function host_fits(placement, bytes)
  if bytes < Module.HOST_CHECK_BYTES or (placement ~= "host" and placement ~= "pinned") then return true end
  return require("uvmrec.host_memory").fits(bytes)
end

-- The elements of a shape of numbers; nil for anything else (the engine names what is wrong).
local function shape_numel(shape)
  local n = 1
  for _, v in ipairs(type(shape) == "table" and shape or {}) do
    if type(v) ~= "number" then return nil end
    n = n * v
  end
  return n
end

-- A tensor for register_parameter, or nil and why: the engine's refusal of the shape too.
local function param_tensor(shape, opts)
  local ok, t, err = pcall(ur_tensor.tensor, shape, opts)
  if not ok then return nil, (tostring(t):gsub("^[^\n]-:%d+: ", "")) end
  return t, err
end

-- Registers parameter `name` as self[name], with its gradient self["grad_" .. name] (zeroed),
-- both f32 of `shape` in the module's placement.  Returns the parameter tensor, for
-- initialisation.  Under bf16 precision a bf16 copy self[name .. "_bf16"] is what the math
-- reads; the optimizers refresh it when they update the f32 master.  Memory that cannot be had
-- is an error naming the module and the parameter.
function Module:register_parameter(name, shape)
  if type(name) ~= "string" or name == "" or name:find("%.") then
    error("register_parameter: name must be a non-empty string without dots, got " .. tostring(name), 2)
  end
  for _, p in ipairs(self._params) do
    if p.name == name then error("register_parameter: '" .. name .. "' is already registered", 2) end
  end
  local opts = place_opts(self)
  opts.dtype = "f32"
  local fits, why = host_fits(opts.placement, 2 * 4 * (shape_numel(shape) or 0))
  if not fits then
    -- at the line that built the module, as below
    error(("%s: parameter %s [%s] and its gradient (f32) need %s"):format(self:type_name(), name,
          table.concat(shape, ", "), why), 4)
  end
  local t, err = param_tensor(shape, opts)
  local g
  if t then g, err = param_tensor(shape, opts) end
  if not g then
    if t then t:free() end
    -- at the line that built the module: register_parameter, __init, the class call, its caller
    error(("%s: parameter %s [%s]: %s"):format(self:type_name(), name, table.concat(shape, ", "), err), 4)
  end
  g:fill(0)
  local rec = { name = name, field = name, grad_field = "grad_" .. name, half_field = name .. "_bf16" }
  self._params[#self._params + 1] = rec
  self[rec.field], self[rec.grad_field] = t, g
  return t
end

-- The tensor the math reads for parameter `name`: the bf16 copy under bf16 precision.
function Module:param(name)
  if self.precision == "bf16" then return self[name .. "_bf16"] end
  return self[name]
end

-- Every parameter of the tree as a list of {name =, tensor =, grad =, half =, module =}, named
-- by path ("3.weight": the weight of the third child); half is the bf16 copy, if any.
-- Tensors are the module's own: an optimizer built on them updates the model in place.
-- Build optimizers after to() and set_precision(), which replace the tensors.
function Module:parameters(prefix, out)
  out = out or {}
  prefix = prefix or ""
  for _, p in ipairs(self._params) do
    out[#out + 1] = { name = prefix .. p.name, tensor = self[p.field], grad = self[p.grad_field],
                      half = self[p.half_field], module = self }
  end
  for i, m in ipairs(self:children()) do m:parameters(prefix .. i .. ".", out) end
  return out
end

function Module:zero_grad(stream)
  for _, p in ipairs(self:parameters()) do
    if p.grad then assert(p.grad:fill(0, stream)) end
  end
  return self
end

-- Refreshes the bf16 copies from the f32 masters (the optimizers do it on each step).
function Module:sync_halves(stream)
  local cast = require("uvmrec.dense").cast
  for _, p in ipairs(self:parameters()) do
    if p.half then cast(p.tensor, p.half, stream) end
  end
  return self
end

local function drop_buffers(m)
  m._bufs = {}
  m._arena = nil
  m.output, m.gradInput = nil, nil
end

-- Moves every parameter, gradient and bf16 copy of the tree to `placement` ("host", "device",
-- "managed", "pinned"; device: a GPU ordinal, default the current one) and gives the tree a
-- fresh arena there.  Environmental failures (no GPU, HBM budget) return nil, message.
-- to()'s copies of m's parameters, gradients and bf16 copies (st: placement, device, moved =
-- {{module, field, copy}, ...}, ok, err).
-- A failure of module m's parameter p (field f of it) named, with its path below root: "Linear(13
-- -> 512): parameter 1.weight to device: hbm budget: ..." (the engine's message alone named
-- neither the module nor the parameter).
local function param_error(root, m, p, f, doing, err)
  local path = p.name
  for _, q in ipairs(root:parameters()) do
    if q.module == m and (q.name == p.name or q.name:sub(-#p.name - 1) == "." .. p.name) then path = q.name end
  end
  return ("%s: parameter %s%s%s: %s"):format(m:tostring():match("^[^\n]*"), path,
    f == p.grad_field and "'s gradient" or f == p.half_field and "'s bf16 copy" or "", doing, err)
end

local function copy_params(m, st)
  if not st.ok then return end
  for _, p in ipairs(m._params) do
    for _, f in ipairs { p.field, p.grad_field, p.half_field } do
      local t = m[f]
      if t then
        local nt, e = t:to(st.placement, st.device)
        if not nt then
          st.ok, st.err = false, param_error(st.root, m, p, f, " to " .. st.placement, e)
          return
        end
        st.moved[#st.moved + 1] = { m, f, nt }
      end
    end
  end
end

local function place_at(m, placement, dev, arena)
  m.placement, m.device = placement, dev
  drop_buffers(m)
  m._arena = arena
end

function Module:to(placement, device)
  if not PLACEMENTS[placement] then
    error("to: placement '" .. tostring(placement) .. "' is not host, pinned, device or managed", 2)
  end
  local st = { placement = placement, device = device, moved = {}, ok = true, err = nil, root = self }
  self:apply(copy_params, st)
  if not st.ok then
    -- the copies made before the failure go now, not when the collector finds them (HBM held
    -- until then counted against the budget a second try meets)
    for _, mv in ipairs(st.moved) do mv[3]:free() end
    return nil, st.err
  end
  local moved = st.moved
  for _, mv in ipairs(moved) do
    local old = mv[1][mv[2]]
    mv[1][mv[2]] = mv[3]
    old:free()
  end
  local dev = device
  if dev == nil then dev = moved[1] and moved[1][3]:device() end
  if placement == "host" or placement == "pinned" then
    dev = -1
  elseif dev == nil then
    dev = lib.current_device(0)
  else
    dev = lib.location(dev)
  end
  self:apply(place_at, placement, dev, require("uvmrec.nn.arena").new(placement, dev))
  return self
end

-- set_precision's work on m (st: precision, arena, ok, err, raised).  A module whose output
-- dtype its own object holds (an embedding collection's) sets it itself (a model of one left it
-- f32 and marked bf16); its refusal is raised again by Module:set_precision, at its caller's line.
local function set_precision(m, st)
  if m.set_output_precision then
    if st.ok then
      local ok, err = pcall(m.set_output_precision, m, st.precision, 1)
      if not ok then st.ok, st.raised = false, err end
    end
    return
  end
  m.precision = st.precision
  drop_buffers(m)
  m._arena = st.arena
  for _, p in ipairs(m._params) do
    local old = m[p.half_field]
    m[p.half_field] = nil
    if old then old:free() end
    if st.precision == "bf16" and st.ok then
      local opts = place_opts(m)
      opts.dtype = "bf16"
      local h, e = ur_tensor.tensor(m[p.field]:size(), opts)
      if not h then
        st.ok, st.err = false, param_error(st.root, m, p, p.half_field, "", e)
        return
      end
      m[p.half_field] = h
    end
  end
end

local function check_precision(precision, level)
  if not PRECISIONS[precision] then
    error("set_precision: '" .. tostring(precision) .. "' is not f32, tf32 or bf16", level + 1)
  end
end

-- "f32" (exact f32 math), "tf32" (f32 tensors, TF32 matrix math on the GPU) or "bf16"
-- (bf16 activations and matrix math, f32 master weights and gradients, f32 accumulation).
function Module:set_precision(precision, stream)
  check_precision(precision, 2)
  -- a module whose own object holds its output dtype (an embedding collection, sharded or not)
  -- has no parameters of its own to copy: it sets that dtype, errors at the caller's line
  if self.set_output_precision then
    self:set_output_precision(precision, 2)
    return self
  end
  local before = self.precision
  local st = { precision = precision, arena = self._arena, ok = true, err = nil, root = self }
  self:apply(set_precision, st)
  if not st.ok then
    -- the modules after the failure were marked bf16 without their copies: the tree goes back
    -- to its precision (f32 where that was bf16, whose copies went), which allocates nothing
    local back = before == "bf16" and "f32" or before
    self:apply(set_precision, { precision = back, arena = self._arena, ok = true, root = self })
    if st.raised then error((tostring(st.raised):gsub("^[^\n]-:%d+: ", "")), 2) end
    return nil, st.err .. "; the model stays in " .. back
  end
  if precision == "bf16" then self:sync_halves(stream) end
  return self
end

-- The dtype of activations under the module's precision.
function Module:act_dtype()
  return self.precision == "bf16" and "bf16" or "f32"
end

-- ---- arena buffers ----

-- The arena that this module's buffers come from: the tree's, shared with share_arena.
function Module:arena()
  if not self._arena then
    local arena = require "uvmrec.nn.arena"
    self._arena = arena.new(self.placement, self.device)
  end
  return self._arena
end

-- Makes this module (and the modules below it) take buffers from `from`'s arena.
local function share_arena(m, a)
  if m._arena ~= a then
    m._bufs = {}
    m._arena = a
  end
end
function Module:share_arena(from)
  return self:apply(share_arena, from:arena())
end

-- A [rows, cols] tensor of `dtype` named `key` in this module, from the arena: allocated once
-- for the largest batch (rows) seen, then a view of its first rows.  One view is kept, of the
-- last row count below the largest, so a steady batch size allocates nothing and batches of
-- many sizes (a collection's values, the last short batch, an evaluation) keep no handle per
-- size; a view given out before stays valid (the buffer's tensor keeps their arena block).
-- Its contents are whatever its last user left.
function Module:buffer(key, dtype, rows, cols)
  local b = self._bufs[key]
  if not b or b.dtype ~= dtype or b.cols ~= cols or b.rows < rows then
    local fits, why = host_fits(self.placement, rows * cols * ur_tensor.dtype_bytes(dtype))
    if not fits then
      error(("%s: buffer %s [%d, %d] of %s needs %s"):format(self:tostring():match("^[^\n]*"), key, rows, cols,
            dtype, why), 2)
    end
    b = { t = self:arena():tensor({ rows, cols }, dtype, self, key), rows = rows, cols = cols, dtype = dtype,
          view = nil, view_rows = nil }
    self._bufs[key] = b
  end
  if b.rows == rows then return b.t end
  if b.view_rows ~= rows then b.view, b.view_rows = b.t:view(0, rows), rows end
  return b.view
end

-- ---- printing ----

-- What follows the type name in tostring, e.g. "(13 -> 512)"; "" by default.
function Module:extra_repr() return "" end -- luacheck: ignore 212

function Module:tostring()
  return self:type_name() .. self:extra_repr()
end

function Module.__tostring(m) return m:tostring() end

return Module
