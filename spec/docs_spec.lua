-- The Lua examples of README.md and docs/*.md run, on the CPU backend.
--
-- Every ```lua block of a file runs in order, in one environment per file, inside a fresh
-- temporary folder (examples may write files there).  Top-level locals (`local` at the start of
-- a line) become variables of that environment, so a block may use what an earlier block of the
-- same file made.  An HTML comment on the line just before a block's fence changes what is done:
--   <!-- spec: skip (why) -->         not run; listed as pending with the reason (needs a GPU,
--                                      a file, ...), never as passed
--   <!-- spec: excerpt PATH -->       not run; the block must be a verbatim part of PATH (a file
--                                      of the tree): a quotation of the code that cannot drift
-- What a block prints is kept, not shown.  Where a GPU is in use, the examples run in a child
-- process without it.  DOCS=README.md,docs/data.md (the environment) runs
-- only those files' blocks.
local lfs = require "lfs"
local ur = require "uvmrec"
local cmd = require "command"

local root = lfs.currentdir() -- `make test` and `uvmrec test` run the specs from the tree's root

local read = cmd.slurp -- a file's text, or nil

-- The Markdown files: README.md, then docs/*.md by name (or the files DOCS lists).
local function markdown_files()
  local only = os.getenv("DOCS")
  if only and only ~= "" then
    local files = {}
    for f in only:gmatch("[^,]+") do files[#files + 1] = f end
    return files, #files
  end
  local files = { "README.md" }
  local docs = {}
  if lfs.attributes(root .. "/docs", "mode") == "directory" then
    for name in lfs.dir(root .. "/docs") do
      if name:match("%.md$") then docs[#docs + 1] = "docs/" .. name end
    end
  end
  table.sort(docs)
  for _, d in ipairs(docs) do files[#files + 1] = d end
  return files, #docs
end

-- The fenced blocks of a Markdown text: {lang, code, line (of the fence), mark = {kind, arg}}.
-- A mark is a `<!-- spec: ... -->` comment on the line before the fence.
local function blocks(text, name)
  local out, lines = {}, {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local i = 1
  while i <= #lines do
    local fence, lang = lines[i]:match("^(```+)%s*([%w_%-]*)%s*$")
    if fence then
      local start, body = i, {}
      i = i + 1
      while i <= #lines and not lines[i]:match("^" .. fence .. "%s*$") do
        body[#body + 1] = lines[i]
        i = i + 1
      end
      if i > #lines then error(("%s:%d: a ``` block that is never closed"):format(name, start)) end
      local prev = lines[start - 1] or ""
      local mark
      local m = prev:match("^%s*<!%-%-%s*spec:%s*(.-)%s*%-%->%s*$")
      if m then
        local kind, arg = m:match("^(%a+)%s*(.-)$")
        if kind == "skip" then
          arg = arg:match("^%((.+)%)$")
          if not arg then error(("%s:%d: write a skip as <!-- spec: skip (why) -->"):format(name, start - 1)) end
        elseif kind == "excerpt" then
          if arg == "" then error(("%s:%d: an excerpt names its file"):format(name, start - 1)) end
        else
          error(("%s:%d: '%s' is not skip (why) or excerpt PATH"):format(name, start - 1, m))
        end
        if lang ~= "lua" then error(("%s:%d: a spec mark before a %s block"):format(name, start - 1, lang)) end
        mark = { kind = kind, arg = arg }
      end
      out[#out + 1] = { lang = lang, code = table.concat(body, "\n") .. "\n", line = start, mark = mark }
    elseif lines[i]:match("<!%-%-%s*spec:") and not (lines[i + 1] or ""):match("^```") then
      error(("%s:%d: a spec mark must be on the line just before a ```lua fence"):format(name, i))
    end
    i = i + 1
  end
  return out
end

-- Top-level locals become the file environment's variables: `local x, y = ...` -> `x, y = ...`,
-- `local function f` -> `function f`, a bare `local x` -> `x = nil`.
local function globalize(code)
  local out = {}
  for l in code:gmatch("([^\n]*)\n") do
    local names, rest = l:match("^local%s+([%a_][%w_%s,]*)=(.*)$")
    if l:match("^local%s+function%s") then
      l = l:gsub("^local%s+", "")
    elseif names and not rest:match("^=") then
      l = names:gsub("%s+$", "") .. " =" .. rest
    elseif l:match("^local%s+[%a_][%w_,%s]*$") then
      l = l:gsub("^local%s+", "") .. " = nil"
    end
    out[#out + 1] = l
  end
  return table.concat(out, "\n") .. "\n"
end

-- The error and the traceback of the example's own frames (busted's are left out).
local function handler(e)
  local tb = debug.traceback(tostring(e), 2)
  return (tb:match("^(.-)\n%s*%[C%]: in function 'xpcall'") or tb)
end

-- Everything unreachable collected: compiled traces may hold objects as constants, and a
-- finalizer's object goes only in the cycle after.
local function collect()
  jit.flush()
  collectgarbage()
  collectgarbage()
end

local function new_env()
  local printed = {}
  local env = setmetatable({}, { __index = _G })
  env.print = function(...)
    local parts = {}
    for k = 1, select("#", ...) do parts[k] = tostring((select(k, ...))) end
    printed[#printed + 1] = table.concat(parts, "\t")
  end
  env._PRINTED = printed
  return env
end

-- With a GPU in use the examples would not run on the CPU backend: they run in a child process
-- of the command with the GPU turned off (UVMREC_NO_GPU=1), as one test.
if ur.gpu() and os.getenv("UVMREC_NO_GPU") ~= "1" then
  describe("the documentation's Lua examples", function()
    it("run on the CPU backend, in a child process with UVMREC_NO_GPU=1", function()
      local out, err, code = cmd.sh("UVMREC_NO_GPU=1 " .. cmd.quote(cmd.bin()) .. " spec/run.lua spec/docs_spec.lua")
      local failed = tonumber(out:match("%d+ passed, (%d+) failed, %d+ skipped%s*$"))
      assert(code == 0 and failed == 0, "the examples on the CPU backend:\n" .. out .. err)
    end)
  end)
  return
end

local files, ndocs = markdown_files()
local only = os.getenv("DOCS") and os.getenv("DOCS") ~= ""

describe("the documentation's Lua examples", function()
  it("finds README.md, the manuals in docs/ and Lua examples in them", function()
    assert.truthy(read(root .. "/README.md"), "no README.md in " .. root)
    if ndocs == 0 then
      pending("no docs/ in this tree (" .. root .. ")")
      return
    end
    local n = 0
    for _, f in ipairs(files) do
      for _, b in ipairs(blocks(assert(read(root .. "/" .. f)), f)) do
        if b.lang == "lua" then n = n + 1 end
      end
    end
    if not only then assert.is_true(n > 0, "no ```lua block in README.md and docs/") end
  end)

  it("turns top-level locals into the file's variables, and only those", function()
    assert.are.equal("a, b = 1, 2\nfunction f() end\nx = nil\n  local y = 3\nlocal_z = 1\n",
      globalize("local a, b = 1, 2\nlocal function f() end\nlocal x\n  local y = 3\nlocal_z = 1\n"))
    assert.are.equal("a = b == c\n", globalize("local a = b == c\n"))
  end)

  for _, file in ipairs(files) do
    local text = read(root .. "/" .. file)
    local list = text and blocks(text, file) or {}
    describe(file, function()
      local dir, env, before
      setup(function()
        dir = cmd.tmpdir()
        env = new_env()
        collect()
        before = ur.memory()
      end)
      teardown(function()
        cmd.rmdir(dir)
        env = nil
        collectgarbage()
      end)

      local k = 0
      for _, b in ipairs(list) do
        if b.lang == "lua" then
          k = k + 1
          local what = ("block %d (line %d)"):format(k, b.line)
          if b.mark and b.mark.kind == "skip" then
            pending(what .. ": " .. b.mark.arg)
          elseif b.mark and b.mark.kind == "excerpt" then
            it(what .. " is a verbatim part of " .. b.mark.arg, function()
              local src = assert(read(root .. "/" .. b.mark.arg), b.mark.arg .. ": no such file")
              assert.is_truthy(src:find(b.code, 1, true),
                ("%s:%d: the block is no longer part of %s"):format(file, b.line, b.mark.arg))
            end)
          else
            it(what .. " runs", function()
              -- as many empty lines first as come before the block: errors give the file's line
              local chunk, err = loadstring(("\n"):rep(b.line) .. globalize(b.code), "=" .. file)
              assert(chunk, err)
              setfenv(chunk, env)
              assert(lfs.chdir(dir))
              local ok, msg = xpcall(chunk, handler)
              lfs.chdir(root)
              if not ok then error(("the example at %s:%d failed:\n%s"):format(file, b.line, msg), 0) end
            end)
          end
        end
      end

      -- The specs after these share the engine: what the examples made (managed tables a hint
      -- policy placed on the GPU, loaders' pinned buffers) must be gone with their environment.
      it("leaves the engine's memory as it found it", function()
        env = nil
        collect()
        local now = ur.memory()
        for _, what in ipairs { "host", "pinned", "device", "managed", "managed_on_gpu" } do
          assert.are.equal(before[what], now[what], what .. " bytes after the examples of " .. file)
        end
        -- on a GPU the dense ops' workspaces stay with their streams (the default stream's for
        -- the process), so an example's first product may leave one: the rest of the HBM returns
        assert.are.equal(before.hbm_used - before.workspace, now.hbm_used - now.workspace,
                         "hbm_used bytes but the workspaces after the examples of " .. file)
      end)
    end)
  end
end)

-- A commit the documents name (results.md's rows, the prose's "(abc1234)") is one of this tree's
-- history: a helper's branch cherry-picked onto main gets new hashes, and a row naming the branch's
-- commit names nothing a clone can check out.  Tokens of 7 hex digits (the documents' short
-- hashes) with a letter and a digit count as commit names; longer ones are values (a CRC32C).
describe("the documentation's commits", function()
  it("are commits of this tree's history", function()
    local git = io.popen("git -C '" .. root .. "' rev-list HEAD 2>/dev/null")
    local history = git and git:read("*a") or ""
    if git then git:close() end
    if history == "" then
      pending("no git history at " .. root .. " (a dist tree)")
      return
    end
    local known = {}
    for h in history:gmatch("%x+") do
      known[h:sub(1, 7)] = true
    end
    local missing = {}
    for _, file in ipairs(files) do
      local text = read(root .. "/" .. file) or ""
      for token in text:gmatch("%f[%w]%x%x%x%x%x%x%x+%f[%W]") do
        if #token == 7 and token:find("%a") and token:find("%d") and not known[token] then
          missing[#missing + 1] = file .. ": " .. token
        end
      end
    end
    assert.same({}, missing)
  end)
end)
