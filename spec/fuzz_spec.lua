-- The libFuzzer targets of engine/fuzz/ (one per C parser of outside input), each run once over
-- its committed seeds (engine/fuzz/seeds/NAME) and the corpus `make fuzz` grew
-- (build/fuzz/corpus/NAME), so an input that once crashed a parser stays a test.  make test
-- builds the targets (clang, libFuzzer, AddressSanitizer and UBSan); `make fuzz` runs them.
local command = require "command"

local function targets()
  local out = {}
  local p = io.popen("ls engine/fuzz/*.c 2>/dev/null")
  for f in p:lines() do out[#out + 1] = f:match("([%w_]+)%.c$") end
  p:close()
  return out
end

local cwd = io.popen("pwd"):read("*l")
local function abs(p) return p:sub(1, 1) == "/" and p or (cwd .. "/" .. p) end

-- Where the targets are: $(BUILD)/fuzz beside $(BUILD)/bin of the command under test.
local function fuzz_dir()
  local bin = command.bin()
  return (bin:match("^(.*)/bin/[^/]*$") or "build") .. "/fuzz"
end

describe("the fuzz targets", function()
  local names = targets()

  it("cover every C parser of outside input", function()
    if #names == 0 then pending("not in a source tree") return end
    local have = {}
    for _, n in ipairs(names) do have[n] = true end
    for _, want in ipairs { "tsv_line", "npy_header", "safetensors_header", "yaml_doc", "kjt_arrays" } do
      assert.is_true(have[want], "engine/fuzz/" .. want .. ".c")
      assert.is_true(command.exists("engine/fuzz/seeds/" .. want), "engine/fuzz/seeds/" .. want .. " holds seeds")
    end
  end)

  for _, name in ipairs(names) do
    it(("%s runs every input of its seeds and corpus without a finding"):format(name), function()
      local bin = fuzz_dir() .. "/" .. name
      if not command.exists(bin) then pending(bin .. " is not built (make test builds it)") return end
      local dirs = { abs("engine/fuzz/seeds/" .. name) }
      local corpus = fuzz_dir() .. "/corpus/" .. name
      if command.exists(corpus) then dirs[#dirs + 1] = abs(corpus) end
      for i, d in ipairs(dirs) do dirs[i] = command.quote(d) end
      -- -runs=0: every input once, no mutation; a crash file would land in a scratch folder.  The
      -- targets carry clang's sanitizer runtime: not gcc's, which make SAN=1 test preloads.
      local tmp = command.tmpdir()
      local _, err, code = command.sh(("cd %s && env -u LD_PRELOAD UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "
        .. "%s -runs=0 "
        .. "-timeout=10 -rss_limit_mb=2048 %s"):format(command.quote(tmp), command.quote(abs(bin)),
        table.concat(dirs, " ")))
      command.rmdir(tmp)
      assert(code == 0, ("%s exited %s over %s:\n%s"):format(name, tostring(code), table.concat(dirs, " "),
        err:sub(-3000)))
      local n = tonumber(err:match("INITED[^\n]*corp: (%d+)/")) or tonumber(err:match("#(%d+)%s+INITED"))
      assert(n and n > 0, name .. " read no input:\n" .. err:sub(-2000))
    end)
  end
end)
