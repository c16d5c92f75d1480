-- uvmrec.config on random input (issue #26): for every setting of the training schema, random
-- texts, good and bad, given by --set and written in a YAML file must be read the same way
-- (the YAML path is the reference: both accept with the same value, or both refuse), every
-- accepted value must obey its schema (in range, finite, an exact integer), and no input makes
-- the parser raise instead of answering.
local config = require "uvmrec.config"
local schema = require("uvmrec.train.config").schema
local h = require "helpers"

-- Every leaf of the schema: {path = "train.steps", chain = {{key, container schema}, ...}, s = leaf}.
local function leaves(s, path, chain, out)
  if s.kind == "map" then
    local keys = {}
    for k in pairs(s.fields) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local c = { unpack(chain) }
      c[#c + 1] = { k, s }
      leaves(s.fields[k], path == "" and k or (path .. "." .. k), c, out)
    end
  elseif s.kind == "dict" then
    local c = { unpack(chain) }
    c[#c + 1] = { "C1", s }
    leaves(s.elem, path .. ".C1", c, out)
  else
    out[#out + 1] = { path = path, chain = chain, s = s }
  end
  return out
end

-- The schema of the leaf alone, nested as in the whole one (other keys left out), and the YAML
-- text that gives the leaf `text`.
local function alone(leaf)
  local s = leaf.s
  for i = #leaf.chain, 1, -1 do
    local key, parent = leaf.chain[i][1], leaf.chain[i][2]
    if parent.kind == "dict" then s = config.dict(s)
    else s = config.map({ [key] = s }) end
  end
  return s
end

local function yaml(leaf, text)
  local lines = {}
  for i, c in ipairs(leaf.chain) do
    local pad = ("  "):rep(i - 1)
    lines[#lines + 1] = pad .. c[1] .. ":" .. (i == #leaf.chain and (" " .. text) or "")
  end
  return table.concat(lines, "\n") .. "\n"
end

local function get(cfg, leaf)
  local v = cfg
  for _, c in ipairs(leaf.chain) do
    if type(v) ~= "table" then return nil end
    v = v[c[1]]
  end
  return v
end

-- Texts for a scalar of kind s: near and past its bounds, odd spellings, other types.
local ODD = { "", "0", "-0", "+0", "+7", "007", "1.", ".5", "-.5e-3", "1e3", "1E3", "1e400", "-1e400", "nan", "inf",
              "-inf", "0x10", "1_000", "9007199254740991", "9007199254740992", "-9007199254740993",
              "99999999999999999999", "true", "false", "yes", "no", "null", "~", "abc", "2.5", "-3", "1e-400" }
local function texts(s, rng)
  local out = { unpack(ODD) }
  if s.kind == "enum" then
    for _, v in ipairs(s.values) do out[#out + 1] = v; out[#out + 1] = v:upper() end
  end
  for _, b in ipairs { s.min, s.max } do
    if b then
      for _, d in ipairs { -1, -0.5, 0, 0.5, 1 } do out[#out + 1] = ("%.17g"):format(b + d) end
    end
  end
  for _ = 1, 12 do
    local r = rng(1000000) - 500000
    local forms = { ("%d"):format(r), ("%.6g"):format(r / 997), ("%.3e"):format(r * 1e3), ("%d"):format(r * 1e9) }
    out[#out + 1] = forms[rng(#forms)]
  end
  return out
end

-- The text as a YAML plain scalar reads it back, or nil when YAML would read it otherwise (a
-- text the file would have to quote): those say nothing about the schema.
local plain_schema = config.map { v = config.string {} }
local function plain(text)
  local c = config.parse("v: " .. text .. "\n", plain_schema)
  return c and c.v == text and text or nil
end

local function obeys(s, v)
  if s.kind == "int" then
    if type(v) ~= "number" or v ~= math.floor(v) or math.abs(v) >= 2 ^ 53 then return false end
  elseif s.kind == "number" then
    if type(v) ~= "number" or v ~= v or math.abs(v) == math.huge then return false end
  elseif s.kind == "bool" then
    return type(v) == "boolean"
  elseif s.kind == "enum" then
    for _, x in ipairs(s.values) do if x == v then return true end end
    return false
  elseif s.kind == "string" then
    return type(v) == "string" and (not s.pattern or v:match(s.pattern) ~= nil)
  elseif s.kind == "scalar" then -- typed by its text: a finite number, a boolean or a string
    return type(v) == "boolean" or type(v) == "string" or type(v) == "number" and v == v and math.abs(v) < math.huge
  end
  if s.min and v < s.min then return false end
  if s.max and v > s.max then return false end
  return true
end

describe("uvmrec.config on random input", function()
  local all = leaves(schema, "", {}, {})

  it("reaches every setting of the training schema", function()
    assert.is_true(#all > 60, #all .. " settings")
  end)

  it("reads a value given by --set as the same value written in the YAML file, or refuses both", function()
    local rng = h.rng(26)
    local compared = 0
    for _, leaf in ipairs(all) do
      local s = alone(leaf)
      local candidates = leaf.s.kind == "list" and {} or texts(leaf.s, rng)
      for _, text in ipairs(candidates) do
        if plain(text) then
          local from_file = config.parse(yaml(leaf, text), s, "x.yaml")
          local cfg = assert(config.parse("{}\n", s, "empty.yaml"))
          local set_ok, set_err = config.set(cfg, s, leaf.path .. "=" .. text)
          local a, b = from_file and get(from_file, leaf), set_ok and get(cfg, leaf)
          assert(
            (from_file == nil and set_ok == nil) or (from_file ~= nil and set_ok ~= nil and a == b),
            ("%s=%s: the file gives %s, --set gives %s"):format(leaf.path, text,
              from_file and tostring(a) or "an error",
              set_ok and tostring(b) or ("an error (" .. tostring(set_err) .. ")")))
          if set_ok then
            assert(obeys(leaf.s, b),
              ("%s=%s was accepted as %s, outside its schema"):format(leaf.path, text, tostring(b)))
          else
            assert.matches("^%-%-set " .. (leaf.path .. "=" .. text):gsub("%p", "%%%0") .. ": ", set_err)
          end
          compared = compared + 1
        end
      end
    end
    assert.is_true(compared > 1500, compared .. " compared")
  end)

  it("reads a list given by --set as the same list in flow style in the file, lengths checked alike", function()
    local rng = h.rng(2026)
    local compared = 0
    for _, leaf in ipairs(all) do
      if leaf.s.kind == "list" then
        local s = alone(leaf)
        for _ = 1, 40 do
          local n = ({ 0, 1, 2, 3, rng(70), 64, 65 })[rng(7)]
          local items, pool = {}, {}
          for _, t in ipairs(texts(leaf.s.elem, rng)) do
            if t ~= "" and plain(t) and not t:find("[,%[%]{}]") then pool[#pool + 1] = t end
          end
          local odd = rng(2) == 1 -- half the lists hold odd items, the others plain whole numbers
          for i = 1, n do items[i] = odd and rng(8) == 1 and pool[rng(#pool)] or tostring(rng(50)) end
          if n > 0 then
            local from_file = config.parse(yaml(leaf, "[" .. table.concat(items, ", ") .. "]"), s, "x.yaml")
            local cfg = assert(config.parse("{}\n", s, "empty.yaml"))
            local set_ok, set_err = config.set(cfg, s, leaf.path .. "=" .. table.concat(items, ","))
            local a, b = from_file and get(from_file, leaf), set_ok and get(cfg, leaf)
            assert((from_file == nil) == (set_ok == nil),
              ("%s=%s: the file %s, --set %s"):format(leaf.path, table.concat(items, ","),
                from_file and "accepts it" or "refuses it", set_ok and "accepts it" or ("refuses it: " .. set_err)))
            if set_ok then
              assert.same(a, b)
              for _, v in ipairs(b) do assert.is_true(obeys(leaf.s.elem, v), leaf.path .. ": " .. tostring(v)) end
              if leaf.s.min_len then assert.is_true(#b >= leaf.s.min_len) end
              if leaf.s.max_len then assert.is_true(#b <= leaf.s.max_len, leaf.path .. ": " .. #b .. " items") end
            end
            compared = compared + 1
          end
        end
      end
    end
    assert.is_true(compared > 50, compared .. " compared")
  end)

  it("answers any --set, however malformed, with a value or a message naming it", function()
    local rng = h.rng(7)
    local cfg = h.tiny()
    local alphabet = "ab._=,-+019 e\t:[]{}#'\"\\"
    for _ = 1, 3000 do
      local n = rng(24)
      local chars = {}
      for i = 1, n do
        local k = rng(#alphabet)
        chars[i] = alphabet:sub(k, k)
      end
      local leaf = all[rng(#all)]
      local assignment = (rng(2) == 1 and leaf.path or "") .. table.concat(chars)
      local ok, res, err = pcall(config.set, cfg, schema, assignment)
      assert(ok, ("--set %q raised: %s"):format(assignment, tostring(res)))
      if not res then assert.matches("^%-%-set ", err) end
    end
  end)

  it("has defaults that obey their own schema", function()
    for _, leaf in ipairs(all) do
      local d = leaf.s.default
      if d ~= nil then
        if leaf.s.kind == "list" then
          for _, v in ipairs(d) do assert.is_true(obeys(leaf.s.elem, v), leaf.path) end
        else
          assert.is_true(obeys(leaf.s, d), leaf.path .. " = " .. tostring(d))
        end
      end
    end
  end)
end)
