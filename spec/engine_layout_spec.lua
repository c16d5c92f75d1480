-- The engine's shape (issue #16, docs/ and README's layout): rooms without circles, one CUDA
-- error mapping, and every op family's table filled by both backends.  Reads the source tree.
local function read(path) return (require("uvmrec.lib").read_file(path)) end

local function files(pattern)
  local out = {}
  for f in io.popen("ls " .. pattern .. " 2>/dev/null"):lines() do out[#out + 1] = f end
  return out
end

-- Code without comments and string literals (enough to find definitions and calls).
local function code(s)
  return (s:gsub("/%*.-%*/", ""):gsub("//[^\n]*", ""):gsub('"[^"\n]*"', '""'))
end

local function in_source_tree()
  return read("engine/include/uvmrec.h") ~= nil
end

describe("the engine's layout", function()
  it("calls between engine/src files go one way: no circles", function()
    if not in_source_tree() then pending("not in a source tree") return end
    local srcs, def, text = files("engine/src/*/*.c"), {}, {}
    assert.is_true(#srcs > 20, "engine/src/<room>/*.c found")
    for _, f in ipairs(srcs) do
      text[f] = code(read(f))
      for line in text[f]:gmatch("[^\n]+") do
        local name = not line:match("^static") and not line:match("^%s") and
                     line:match("^[%w_ %*]-[ %*](ur_[%w_]+)%(")
        if name and not line:match(";%s*$") then def[name] = f end
      end
    end
    local edges = {}
    for _, f in ipairs(srcs) do
      edges[f] = {}
      for name in text[f]:gmatch("(ur_[%w_]+)%s*%(") do
        local g = def[name]
        if g and g ~= f and not edges[f][g] then edges[f][g] = name end
      end
    end
    -- Tarjan's strongly connected components: any with two files is a circle.
    local index, low, on, stack, n, circles = {}, {}, {}, {}, 0, {}
    local function visit(v)
      n = n + 1
      index[v], low[v] = n, n
      stack[#stack + 1], on[v] = v, true
      for w in pairs(edges[v]) do
        if not index[w] then
          visit(w)
          low[v] = math.min(low[v], low[w])
        elseif on[w] then
          low[v] = math.min(low[v], index[w])
        end
      end
      if low[v] == index[v] then
        local c = {}
        repeat
          local w = table.remove(stack)
          on[w], c[#c + 1] = false, w
        until w == v
        if #c > 1 then
          local why = {}
          for _, a in ipairs(c) do
            for _, b in ipairs(c) do
              if edges[a][b] then why[#why + 1] = ("%s -> %s (%s)"):format(a, b, edges[a][b]) end
            end
          end
          circles[#circles + 1] = table.concat(why, "; ")
        end
      end
    end
    for _, f in ipairs(srcs) do if not index[f] then visit(f) end end
    assert.are.same({}, circles)
  end)

  it("maps CUDA's errors to statuses in one place, kernels/common.cuh", function()
    if not in_source_tree() then pending("not in a source tree") return end
    local where = {}
    for _, pat in ipairs { "kernels/*.cu", "kernels/*.cuh", "engine/src/*/*.c", "engine/src/*/*.h" } do
      for _, f in ipairs(files(pat)) do
        if code(read(f)):match("ur_status%s+[%w_]+%s*%(%s*cudaError_t") then where[#where + 1] = f end
      end
    end
    assert.are.same({ "kernels/common.cuh" }, where)
  end)

  it("fills every op family's table in the CPU backend and in kernels/<family>.cu", function()
    if not in_source_tree() then pending("not in a source tree") return end
    local backend = read("engine/src/core/backend.h")
    local cpu = code(read("engine/src/core/backend_cpu.c"))
    local cuda = code(read("kernels/backend.cu"))
    local families = {}
    for fam in backend:gmatch("const struct ur_([%w_]+)_ops %*[%w_]+;") do families[#families + 1] = fam end
    assert.is_true(#families >= 6, "families found in core/backend.h")
    local all = {}
    for _, f in ipairs(files("engine/src/*/*.c")) do all[#all + 1] = code(read(f)) end
    all = table.concat(all, "\n")
    for _, fam in ipairs(families) do
      assert.truthy(cpu:match("%." .. fam .. " = &ur__cpu_" .. fam .. "_ops"), fam .. ": the CPU backend's entry")
      assert.truthy(all:match("const ur_" .. fam .. "_ops ur__cpu_" .. fam .. "_ops = {"),
                    fam .. ": the CPU reference's table")
      assert.truthy(cuda:match("b%->" .. fam .. " = &ur__cuda_" .. fam .. "_ops"), fam .. ": the CUDA backend's entry")
      local cu = read("kernels/" .. fam .. ".cu")
      assert.truthy(cu, "kernels/" .. fam .. ".cu")
      assert.truthy(code(cu):match("const ur_" .. fam .. "_ops ur__cuda_" .. fam .. "_ops = {"),
                    fam .. ": kernels/" .. fam .. ".cu fills the table")
    end
  end)

  it("does not build on a big-endian host, whose reads of its files in place would be wrong", function()
    -- safetensors data, npy arrays and the quantized rows' f16 scale and bias are little-endian
    -- and read in place: a big-endian build misread them without a word (the safetensors header
    -- length alone is read byte by byte)
    if not in_source_tree() then pending("not in a source tree") return end
    local cmd = require "command"
    local line = "echo '#include \"core/core.h\"' | cc -std=c11 -D_GNU_SOURCE -fsyntax-only -x c - "
      .. "-Iengine/include -Iengine/src %s 2>&1"
    local out, _, status = cmd.sh(line:format(""))
    assert.equal(0, status, out)
    out, _, status = cmd.sh(line:format("-U__BYTE_ORDER__ -D__BYTE_ORDER__=__ORDER_BIG_ENDIAN__"))
    assert.is_not.equal(0, status)
    assert.matches("uvmrec needs a little%-endian host", out)
  end)

  it("says in each file's first line what the file is for", function()
    if not in_source_tree() then pending("not in a source tree") return end
    local bad = {}
    for _, pat in ipairs { "engine/src/*/*.[ch]", "kernels/*.cu", "kernels/*.cuh" } do
      for _, f in ipairs(files(pat)) do
        local name = f:match("[^/]+$")
        local first = read(f):match("^[^\n]*")
        if not first:find("/* " .. name .. ":", 1, true) then bad[#bad + 1] = f end
      end
    end
    assert.are.same({}, bad)
  end)
end)
