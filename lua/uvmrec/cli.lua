-- uvmrec.cli: the command line of every subcommand (scripts/NAME.lua, `uvmrec NAME`) and
-- benchmark (scripts/bench/*.lua), from one declaration each, on lua-argparse.  Parsing, the
-- `--help` text and the errors (exit code 2, naming the option and the value) all come from it:
--
--   local cmd = cli.command {
--     name = "datagen",                          -- `uvmrec datagen`
--     summary = "writes synthetic data as binary day files",  -- its line in `uvmrec --help`
--     description = "...",                       -- optional: more text for `--help`
--     { "CONFIG", "a preset or a config file" }, -- a positional argument (opts.config)
--     { "--out DIR", "where the files go" },     -- an option with a value (opts.out)
--     { "--samples N", "samples in all", type = "whole", default = 1000 },
--     { "--set K=V", "a config value", many = true },  -- repeatable: a list
--     { "--cpu", "on the CPU even where a GPU is" },   -- a flag: true or false
--   }
--   local opts = cmd:parse(arg)
--
-- Positional arguments are written as in a usage line: NAME, NAME... (one or more), [NAME] (at
-- most one), [NAME...] (any number); a [NAME...] with rest = true also takes every argument that
-- is not one of the declared options, in order, to hand on (`uvmrec test` passes them to
-- busted).  An entry's value lands in opts under its name in lower case with - as _, or under
-- key = "...".  type: "string" (the default), "number", "integer", "whole" (an integer >= 0;
-- both below 2^53 in magnitude, where a number holds each exactly), "list" (comma-separated
-- strings), "numbers" (comma-separated numbers); choices = {...}
-- restricts a string or each item of a list; min = N refuses a number (or an item) below N;
-- check = function(value) -> value or nil, message
-- refines a value (the message is shown after the option's name).  default is the value when
-- the option is not given (flags: false, many: {}); it is shown in the help; required = true
-- makes an option one that must be given.  On the declaration, mutex = {{"--a", "--b"}, ...}
-- names options that exclude each other.
--
-- Options that mean the same in several commands are declared once, in M.options, and stand in
-- a declaration as any entry does (the help lists them where they stand):
--
--   local options = require("uvmrec.cli").options
--   local cmd = require("uvmrec.cli").command {
--     name = "scripts/bench/x.lua", summary = "...",
--     options.config,                            -- the benchmarks' --config
--     { "--steps N", "timed steps", type = "whole", default = 20 },  -- this command's own
--     options.cpu,
--     options.out,
--   }
--
-- An option that means something else in one command (another default, a narrower sense, a value
-- appended rather than written) is that command's own entry.
--
-- Declare first, before any work: `uvmrec --help` runs each script up to cli.command to read its
-- summary (M.describe), and stops it there.
local argparse = require "argparse"

local M = {}

local TYPES = { string = true, number = true, integer = true, whole = true, list = true, numbers = true }
local NUMERIC = { number = true, integer = true, whole = true, numbers = true }
local EXACT = 2 ^ 53 -- whole and integer values stay below it: a Lua number holds each one exactly
local ENTRY_KEYS = { [1] = true, [2] = true, type = true, choices = true, min = true, check = true, default = true,
                     many = true, key = true, rest = true, required = true }

-- Set while M.describe runs a script: cli.command then stops it with its declaration.
local describing = false
local DESCRIBED = {}

local Command = {}
Command.__index = Command

-- Mistakes in a declaration, raised at the line of the script that calls cli.command.
local function misuse(msg) error("cli: " .. msg, 4) end

local function words(list)
  if #list == 1 then return list[1] end
  return table.concat(list, ", ", 1, #list - 1) .. " or " .. list[#list]
end

local function one(v, kind, choices, min)
  if NUMERIC[kind] then
    local n = tonumber(v)
    if kind == "number" or kind == "numbers" then
      if not n then return nil, "is not a number" end
    elseif not require("uvmrec.lib").whole_in(n or 0.5, kind == "whole" and 0 or 1 - EXACT, EXACT) then
      -- whole numbers past 2^53 are not all numbers (9007199254740993 reads as ...992)
      local whole = n and n == math.floor(n) -- or infinite
      if kind == "whole" and not (whole and n >= 0) then return nil, "is not a whole number (0, 1, 2, ...)" end
      if not whole then return nil, "is not an integer" end
      if kind == "whole" then return nil, "is 2^53 or more; expected a whole number below 2^53" end
      return nil, ("is %s2^53 or %s; expected an integer between -2^53 and 2^53"):format(n < 0 and "-" or "",
                                                                                      n < 0 and "less" or "more")
    end
    if min and n < min then return nil, "is less than " .. min end
    return n
  end
  if choices then
    for _, c in ipairs(choices) do
      if v == c then return v end
    end
    return nil, "is not " .. words(choices)
  end
  return v
end

-- The converter of an entry: the text to its value, or nil, "<name>: '<text>' <what is wrong>".
local function converter(e)
  return function(text)
    local v, err
    if e.type == "list" or e.type == "numbers" then
      v = {}
      for item in text:gmatch("[^,]+") do
        local x, xerr = one(item, e.type, e.choices, e.min)
        if x == nil then return nil, ("%s: '%s' %s"):format(e.name, item, xerr) end
        v[#v + 1] = x
      end
      if #v == 0 then return nil, ("%s: '%s' holds no items"):format(e.name, text) end
    else
      v, err = one(text, e.type, e.choices, e.min)
      if v == nil then return nil, ("%s: '%s' %s"):format(e.name, text, err) end
    end
    if e.check then
      local checked, cerr = e.check(v)
      if checked == nil then return nil, ("%s: %s"):format(e.name, cerr or ("'" .. text .. "' is not accepted")) end
      v = checked
    end
    return v
  end
end

local function show_default(v)
  if type(v) == "table" then return table.concat(v, ",") end
  return tostring(v)
end

-- One entry of a declaration, checked and normalised.
local function entry(raw, i)
  if type(raw) ~= "table" or type(raw[1]) ~= "string" or type(raw[2]) ~= "string" then
    misuse(("entry %d: expected { \"--name VALUE\" or \"NAME\", \"help\", ... }"):format(i))
  end
  for k in pairs(raw) do
    if not ENTRY_KEYS[k] then misuse(("entry %d (%s): unknown field '%s'"):format(i, raw[1], tostring(k))) end
  end
  local e = { help = raw[2], type = raw.type or "string", choices = raw.choices, min = raw.min, check = raw.check,
              default = raw.default, many = raw.many, rest = raw.rest, required = raw.required }
  if not TYPES[e.type] then misuse(("%s: unknown type '%s'"):format(raw[1], tostring(e.type))) end
  if e.min ~= nil and (type(e.min) ~= "number" or not NUMERIC[e.type]) then
    misuse(("%s: min = %s: a number, for type number, integer, whole or numbers"):format(raw[1], tostring(e.min)))
  end
  local name, value = raw[1]:match("^(%-%-?[%w][%w%-]*)%s*(%S*)$")
  if name then
    e.kind = value == "" and "flag" or "option"
    e.name, e.value = name, value
    e.key = raw.key or name:gsub("^%-+", ""):gsub("%-", "_")
    local typed = raw.type or raw.choices or raw.min or raw.check or raw.default ~= nil or raw.many or raw.required
    if e.kind == "flag" and typed then
      misuse(raw[1] .. ": a flag takes no type, choices, min, check, default, many or required")
    end
  else
    local open, word, dots, close = raw[1]:match("^(%[?)([%u][%u%d_]*)(%.?%.?%.?)(%]?)$")
    if not word or (open == "[") ~= (close == "]") or (dots ~= "" and dots ~= "...") then
      misuse(("entry %d: '%s' is neither --name [VALUE] nor NAME, NAME..., [NAME] or [NAME...]"):format(i, raw[1]))
    end
    e.kind = "argument"
    e.name = word
    e.args = open == "[" and (dots == "..." and "*" or "?") or (dots == "..." and "+" or 1)
    e.key = raw.key or word:lower()
    if e.rest and e.args ~= "*" then misuse(raw[1] .. ": rest = true needs [NAME...]") end
    if e.many or e.required then misuse(raw[1] .. ": many and required are for options; write NAME... or NAME") end
  end
  return e
end

-- The argparse parser of a declaration.
local function parser(self)
  local p = argparse(self.prog, self.description and (self.summary .. "\n\n" .. self.description) or self.summary)
  p:add_help(false):help_max_width(100):usage_max_width(100):usage_margin(7)
  p:flag("-h --help", "Show this help and exit.")
  local by_name = {}
  for _, e in ipairs(self.entries) do
    local help = e.help
    if e.default ~= nil and e.kind ~= "flag" then help = help .. " (default: " .. show_default(e.default) .. ")" end
    local el
    if e.kind == "flag" then
      el = p:flag(e.name, help):target(e.key)
    elseif e.kind == "option" then
      el = p:option(e.name, help):argname(e.value):target(e.key):convert(converter(e))
      if e.many then el:count(e.required and "1+" or "*") elseif e.required then el:count(1) end
    else
      el = p:argument(e.name, help):argname(e.name):target(e.key):args(e.args)
      if not e.rest then el:convert(converter(e)) end
    end
    by_name[e.name] = el
  end
  for _, group in ipairs(self.mutex or {}) do
    local els = {}
    for _, n in ipairs(group) do
      els[#els + 1] = by_name[n] or misuse(("mutex: '%s' is not an option of %s"):format(tostring(n), self.prog))
    end
    p:mutex(unpack(els))
  end
  return p
end

-- A command from its declaration (see the top of this file).
function M.command(decl)
  if type(decl) ~= "table" then error("cli.command: expected a declaration table", 2) end
  if type(decl.name) ~= "string" or decl.name == "" then error("cli.command: name must be a string", 2) end
  if type(decl.summary) ~= "string" or decl.summary:find("\n") then
    error("cli.command " .. decl.name .. ": summary must be one line of text", 2)
  end
  local self = setmetatable({ name = decl.name, prog = "uvmrec " .. decl.name, summary = decl.summary,
                              description = decl.description, mutex = decl.mutex, entries = {} }, Command)
  for i, raw in ipairs(decl) do
    local e = entry(raw, i)
    for _, other in ipairs(self.entries) do
      if other.key == e.key then error(("cli.command %s: %s and %s both land in opts.%s"):format(
        decl.name, other.name, e.name, e.key), 2) end
    end
    if e.rest then self.rest = e end
    self.entries[#self.entries + 1] = e
  end
  if describing then error({ [DESCRIBED] = self }, 0) end
  self.parser = parser(self)
  return self
end

function Command:usage() return (self.parser:get_usage():gsub("^Usage:", "usage:")) end
function Command:help() return (self.parser:get_help():gsub("^Usage:", "usage:")) end

-- With rest: the declared options (and their values) stay for argparse, the rest is handed on.
function Command:split(args)
  local mine, rest = {}, {}
  local takes = {}
  for _, e in ipairs(self.entries) do
    if e.kind ~= "argument" then takes[e.name] = e.kind == "option" end
  end
  takes["-h"], takes["--help"] = false, false
  local i = 1
  while i <= #args do
    local a = args[i]
    local name = a:match("^(%-%-?[^=]+)=") or a
    if a == "--" then
      for j = i + 1, #args do rest[#rest + 1] = args[j] end
      break
    elseif takes[name] ~= nil then
      mine[#mine + 1] = a
      if takes[name] and name == a and args[i + 1] then
        i = i + 1
        mine[#mine + 1] = args[i]
      end
    else
      rest[#rest + 1] = a
    end
    i = i + 1
  end
  return mine, rest
end

-- opts, or nil and "help" when help was asked for, or nil and the message of what is wrong.
function Command:check(args)
  args = args or {}
  local list = {}
  for i = 1, #args do list[i] = tostring(args[i]) end
  local rest
  if self.rest then list, rest = self:split(list) end
  for _, a in ipairs(list) do
    if a == "--" then break end
    if a == "-h" or a == "--help" then return nil, "help" end
  end
  -- argparse takes "-5" after an option for an unknown option: join it to its option (a long
  -- one by "=", a short one directly: argparse reads "-n=5" as the value "=5").
  local takes_value = {}
  for _, e in ipairs(self.entries) do
    if e.kind == "option" then takes_value[e.name] = true end
  end
  local joined = {}
  local i = 1
  while i <= #list do
    local a, v = list[i], list[i + 1]
    if takes_value[a] and v and v:match("^%-[%d.]") then
      joined[#joined + 1] = a .. (a:match("^%-%-") and "=" or "") .. v
      i = i + 2
    else
      joined[#joined + 1] = a
      i = i + 1
    end
    if a == "--" then
      for j = i, #list do joined[#joined + 1] = list[j] end
      break
    end
  end
  list = joined
  local ok, result = self.parser:pparse(list)
  if not ok then return nil, result end
  result.help = nil
  for _, e in ipairs(self.entries) do
    if e.rest then
      result[e.key] = rest
    elseif result[e.key] == nil then
      if e.kind == "flag" then result[e.key] = false
      elseif e.many or e.args == "*" then result[e.key] = {} end
      if e.default ~= nil then result[e.key] = e.default end
    end
  end
  return result
end

-- Under `uvmrec launch` (UVMREC_JOB, its job folder), this rank's exit code and message for
-- launch's report, noted as the uvmrec command notes its own exit (engine/host/main.c): a rank
-- that exits through os.exit never reaches that note, and launch would say it died without a
-- word.  M.failure is the last failure a command printed (fail, misuse), for uvmrec.dist's
-- os.exit, which notes the exit again once the job has started.
function M.note_exit(code, text)
  local dir = os.getenv("UVMREC_JOB")
  local env = require("uvmrec.dist.environment")()
  local rank = env.launcher and env.rank -- a launched rank's; none outside a job
  if not dir or dir == "" or not rank then return end
  local path = ("%s/rank-%d.exit"):format(dir, rank)
  local f = io.open(path .. ".tmp", "w")
  if not f then return end
  f:write(("%d\t%s\n"):format(code, code ~= 0 and (text or ("os.exit(%d)"):format(code)) or ""))
  if f:close() then os.rename(path .. ".tmp", path) end
end

-- A failure that follows a Ctrl-C (the engine's interrupt flag, which the uvmrec command raises
-- on SIGINT: Lua code caught its "interrupted" error) exits 130, as a command stopped by it does.
local function fail_exit(code, msg)
  local lib = package.loaded["uvmrec.lib"]
  if lib and lib.C.ur_interrupt_get() ~= 0 then code = 130 end
  M.failure = tostring(msg)
  M.note_exit(code, M.failure)
  os.exit(code)
end

-- A failure once the arguments are read (a file, the data, a check): the message on stderr, then
-- exit with code (default 1).
function Command:fail(msg, code)
  io.stdout:flush()
  io.stderr:write(self.prog, ": ", tostring(msg), "\n")
  io.stderr:flush()
  fail_exit(code or 1, msg)
end

-- A wrong argument: the message and the usage on stderr, exit 2.
function Command:misuse(msg)
  io.stdout:flush()
  io.stderr:write(self.prog, ": ", tostring(msg), "\n", self:usage(), "\n(`", self.prog,
                  " --help` describes every option)\n")
  io.stderr:flush()
  fail_exit(2, msg)
end

-- opts from the arguments (a script's arg); --help prints the help and exits 0, a wrong
-- argument exits 2 with its message and the usage.
function Command:parse(args)
  local opts, err = self:check(args)
  if opts then return opts end
  if err == "help" then
    io.stdout:write(self:help(), "\n")
    io.stdout:flush()
    os.exit(0)
  end
  self:misuse(err)
end

-- The benchmarks' default config where none is given: the largest preset that fits where they run.
M.BENCH_CONFIG = { gpu = "dlrm_mlperf_v1_2m", cpu = "dlrm_tiny" }

-- The --set values a benchmark puts before the user's for config (a preset's name): MLPerf's SGD
-- lr of 24 without its warm-up schedule turns the synthetic data's losses NaN in a few steps, so
-- the MLPerf presets train at 1.0; a --set after these may say otherwise.
function M.bench_sets(config)
  if config:match("mlperf") then return { "optimizer.lr=1.0" } end
  return {}
end

-- The program running this script, to run another script the same way: the lowest of the
-- negative arg indices (`uvmrec -e CODE script.lua` puts the code at arg[-1] and the program
-- at arg[-3]); "luajit" where the host gives none.
function M.interpreter()
  local i = -1
  if arg == nil or arg[i] == nil then return "luajit" end
  while arg[i - 1] ~= nil do i = i - 1 end
  return arg[i]
end

-- The uvmrec program, to run a subcommand from a script: UVMREC_BIN (make test sets it), else
-- the command running this script (a dist tree's bin/uvmrec), else the build's.
function M.program()
  local host = package.loaded["uvmrec.host"]
  return os.getenv("UVMREC_BIN") or (type(host) == "table" and host.binary) or "build/bin/uvmrec"
end

-- Where a benchmark with options.cpu (and options.config) runs and what it trains: gpu, true where
-- a GPU is in use and --cpu is not given, and the config, --config or BENCH_CONFIG's for there.
function M.bench_config(opts)
  local gpu = require("uvmrec").gpu() and not opts.cpu
  return gpu, opts.config or M.BENCH_CONFIG[gpu and "gpu" or "cpu"]
end

-- The 1-minute load average as /proc/loadavg writes it (the machine may be shared: a benchmark
-- records it beside its times); nil where there is none.
function M.load_average()
  local f = io.open("/proc/loadavg")
  if not f then return nil end
  local l = f:read("*l")
  f:close()
  return l and l:match("^(%S+)")
end

-- SIGINT and SIGTERM only raise the engine's interrupt flag from here on (ur_signals_catch, as
-- training's signals hook takes them: the command catches them, never the engine behind a host
-- program's back), so work that polls the flag stops between its steps and the command tidies up
-- (a temporary file removed) instead of dying where it stood.  Returns caught() (the signal's
-- number since, or nil) and finish(what): the handlers given back, then, where a signal came, the
-- command fails with exit 128 + the signal: "interrupted by SIGTERM" .. what.  A second signal
-- ends the process at once (one-shot handlers), as SIGKILL does.
function Command:catch_signals()
  local lib = require "uvmrec.lib"
  local C = lib.C
  local ok, err = lib.check(C.ur_signals_catch(1))
  if not ok then self:fail(err) end
  local function caught()
    local sig = C.ur_signals_caught()
    return sig ~= 0 and sig or nil
  end
  return {
    caught = caught,
    finish = function(what)
      -- the handlers as they were and the flag down (a failure with it up exits 130, SIGINT's),
      -- then the signal read: one caught up to the handlers' return is still said
      C.ur_signals_catch(0)
      local sig = caught()
      if sig then
        self:fail(("interrupted by %s%s"):format(require("uvmrec.lib").signal_name(sig), what or ""), 128 + sig)
      end
    end,
  }
end

-- Where a benchmark with the flags --gpu and --cpu (declared with mutex = {{"--gpu", "--cpu"}})
-- runs: "gpu" or "cpu" as asked, else "gpu" where a GPU is in use; --gpu without one fails
-- (exit 1) with the reason.
function Command:mode(args)
  local ur = require "uvmrec"
  local mode = args.gpu and "gpu" or args.cpu and "cpu" or (ur.gpu() and "gpu" or "cpu")
  if mode == "gpu" and not ur.gpu() then self:fail("--gpu asked but no GPU is in use: " .. ur.cuda_error()) end
  return mode
end

-- A --out FILE a command can write: its folder is there (and the file, where it is, can be read),
-- said when the arguments are read, before a benchmark's minutes of measuring (lib.file_target).
function M.writable(path)
  local ok, err = require("uvmrec.lib").file_target(path)
  if not ok then return nil, ("'%s': %s"):format(path, err) end
  return path
end

-- The options several commands share, each with one meaning wherever it stands (see the top).
M.options = {
  config = { "--config C", ("a config or preset (default: %s on a GPU, %s on the CPU)"):format(
    M.BENCH_CONFIG.gpu, M.BENCH_CONFIG.cpu) },
  set = { "--set K=V", "any config value", many = true },
  batch_size = { "--batch B", "the batch size (sets train.batch_size)", type = "whole", min = 1 },
  precision = { "--precision P", "the MLPs' precision (sets model.precision)", choices = { "f32", "tf32", "bf16" } },
  cpu = { "--cpu", "on the CPU even where a GPU is" },
  zipf = { "--zipf S", "the ids' Zipf exponent", type = "number", default = 1.05 },
  python = { "--python PY", "the Python with torch", default = os.getenv("PYTHON") or "python3" },
  no_torch = { "--no-torch", "leave PyTorch out" },
  out = { "--out FILE", "write JSON lines", check = M.writable },         -- the file made anew each run
  out_append = { "--out FILE", "append JSON lines", check = M.writable }, -- runs accumulate in the file
}

-- The command a script declares, without running the script past its declaration; nil,
-- message when it declares none.
function M.describe(path)
  local text, ferr = require("uvmrec.lib").read_file(path)
  if not text then return nil, ferr end
  -- A script that does not use this module would run whole: leave it alone.
  if not text:find("uvmrec.cli", 1, true) then return nil, path .. " declares no command (uvmrec.cli)" end
  local chunk, err = loadstring(text, "@" .. path)
  if not chunk then return nil, err end
  local exit = os.exit
  os.exit = function(code) -- luacheck: ignore 122
    error(("%s exits (code %s) before its declaration"):format(path, tostring(code)), 2)
  end
  describing = true
  local ok, stop = pcall(chunk)
  describing = false
  os.exit = exit -- luacheck: ignore 122
  if not ok and type(stop) == "table" and stop[DESCRIBED] then return stop[DESCRIBED] end
  return nil, ("%s declares no command (uvmrec.cli)%s"):format(path, ok and "" or ": " .. tostring(stop))
end

-- The commands of a scripts/ folder (default: the command's tree), sorted by name, each
-- {name =, summary =} (the summary says why when the script declares none).
function M.commands(dir)
  local host = package.loaded["uvmrec.host"]
  dir = dir or host and host.scripts
  if not dir then return nil, "cli: no scripts folder (run under the uvmrec command, or name one)" end
  local out = {}
  for _, f in ipairs(require("uvmrec.lib").dir_list(dir, "", ".lua") or {}) do
    local name = f:match("^([%w][%w_%-]*)%.lua$")
    if name then
      local c, err = M.describe(dir .. "/" .. name .. ".lua")
      out[#out + 1] = { name = name, summary = c and c.summary or ("(" .. err .. ")") }
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

-- `uvmrec --help`'s list: a line per command.
function M.print_commands(dir)
  local list = assert(M.commands(dir))
  local width = 0
  for _, c in ipairs(list) do width = math.max(width, #c.name) end
  io.write("The commands here (`uvmrec COMMAND --help` lists a command's options):\n")
  for _, c in ipairs(list) do io.write(("  %-" .. width .. "s  %s\n"):format(c.name, c.summary)) end
  io.flush()
end

return M
