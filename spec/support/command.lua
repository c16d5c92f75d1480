-- Spec helpers for the uvmrec command: where it is, running it, files and temporary folders, a
-- wall clock, and a session on a pseudo-terminal (util-linux's `script`) to drive the REPL with
-- keys.
local M = {}

-- The command under test: UVMREC_BIN (make test and `uvmrec test` set it), else the program
-- running these specs when it is the command, else the default build's.
function M.bin()
  local b = os.getenv("UVMREC_BIN")
  if b and b ~= "" then return b end
  local host = package.loaded["uvmrec.host"]
  if host and host.binary and host.binary:match("/uvmrec$") then return host.binary end
  return "build/bin/uvmrec"
end

M.quote = require("uvmrec.lib").shell_quote

-- vars ({NAME = value}) as the shell's assignments `NAME='value' ...` for `env` to put before a
-- command, sorted by name (the same table, the same line).
function M.assignments(vars)
  local parts = {}
  for k, v in pairs(vars) do parts[#parts + 1] = k .. "=" .. M.quote(v) end
  table.sort(parts)
  return table.concat(parts, " ")
end

local function ok(r) return r == 0 or r == true end

function M.have(program) return ok(os.execute("command -v " .. program .. " >/dev/null 2>&1")) end

-- A file's bytes, or nil when it cannot be read (uvmrec.lib's read_file, without the message).
local function slurp(path) return (require("uvmrec.lib").read_file(path)) end
M.slurp = slurp

-- Writes text to path; returns path.
function M.spit(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
  return path
end

-- The lines of a file (the first n of them, when n is given), without their ends.
function M.lines(path, n)
  local out = {}
  for l in io.lines(path) do
    if #out == n then break end
    out[#out + 1] = l
  end
  return out
end

function M.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Runs a shell command (with `input` on its stdin when given): its stdout, stderr, exit code.
function M.sh(cmd, input)
  local errf, inf = os.tmpname(), nil
  if input then
    inf = os.tmpname()
    M.spit(inf, input)
    cmd = "(" .. cmd .. ") < " .. inf
  end
  local p = io.popen("(" .. cmd .. ") 2>" .. errf .. "; echo \"__exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("__exit=(%d+)\n$"))
  out = out:gsub("__exit=%d+\n$", "")
  local err = slurp(errf) or ""
  os.remove(errf)
  if inf then os.remove(inf) end
  return out, err, code
end

-- M.sh under OpenBLAS's Haswell kernels, whose rounding depends neither on the machine's vector
-- width nor on a batch's row count (docs/distributed.md): for specs that compare losses bit for
-- bit with recorded ones or with another run's.
function M.sh_fixed_blas(cmd, input) return M.sh("env OPENBLAS_CORETYPE=Haswell " .. cmd, input) end

-- The command with arguments (a string, already quoted as the shell needs).
function M.run(args, input) return M.sh(M.quote(M.bin()) .. " " .. args, input) end

-- The commands a tree offers, as the command lists them: its scripts/*.lua and `env`, sorted.
function M.commands(scripts_dir)
  local names = { "env" }
  for _, f in ipairs(require("uvmrec.lib").dir_list(scripts_dir, "", ".lua") or {}) do
    local n = f:match("^([%w_%-]+)%.lua$")
    if n then names[#names + 1] = n end
  end
  table.sort(names)
  return table.concat(names, ", ")
end

-- The commands `uvmrec --help` lists, a line each with its summary, in commands()'s form (env,
-- which the usage names above the list, included); nil when there is no list.  Summaries that
-- say a script declares no command are returned as the second value.
function M.listed(help)
  local listed = help:match("\nThe commands here [^\n]*\n(.*)$")
  if not listed then return nil end
  local names, bad = { "env" }, {}
  for name, summary in listed:gmatch("  (%S+) +([^\n]+)\n") do
    names[#names + 1] = name
    if summary:find("declares no command", 1, true) then bad[#bad + 1] = name .. ": " .. summary end
  end
  table.sort(names)
  return table.concat(names, ", "), bad
end

function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/uvmrec-spec.XXXXXX")
  local d = p:read("*l")
  p:close()
  return d
end

function M.rmdir(d)
  if d and d:match("^/tmp/uvmrec%-spec%.") then os.execute("rm -rf " .. M.quote(d)) end
end

-- Seconds since boot, to 10 ms: a wall clock without spawning anything.
function M.now() return tonumber(slurp("/proc/uptime"):match("^(%S+)")) end

function M.sleep(s) os.execute("sleep " .. s) end

-- Whether background() can give its command SIGINT: a shell's `&` makes SIGINT ignored in what
-- it starts, which `env --default-signal` (coreutils 8.31) undoes.
function M.can_background()
  local _, _, code = M.sh("env --default-signal=INT true")
  return code == 0
end

-- Starts a shell command line in the background, SIGINT at its default as in a terminal, its
-- stdout and stderr into log.  Returns the job: job.pid is the command's own process (a script
-- notes its id and execs the command, so no process listing is needed), job:wait(limit) the
-- output and exit code once it ended, or the output and nil after limit seconds.
function M.background(cmdline, log)
  local script, pidf = log .. ".sh", log .. ".pid"
  M.spit(script, ("echo $$ > %s\nexec %s\n"):format(M.quote(pidf), cmdline))
  M.sh(("(env --default-signal=INT sh %s > %s 2>&1; echo \"exit=$?\" >> %s) </dev/null >/dev/null 2>&1 &"):format(
    M.quote(script), M.quote(log), M.quote(log)))
  local function noted() return tonumber((slurp(pidf) or ""):match("^(%d+)\n")) end
  local t0, pid = M.now(), noted()
  while not pid and M.now() - t0 < 30 do
    M.sleep(0.05)
    pid = noted()
  end
  assert(pid, "command.background: no process id in " .. pidf .. " after 30 s")
  local job = { pid = pid, log = log }
  function job.wait(_, limit)
    local t1 = M.now()
    while true do
      local out = slurp(log) or ""
      local code = out:match("exit=(%d+)\n$")
      if code then return out, tonumber(code) end
      if M.now() - t1 > limit then return out, nil end
      M.sleep(0.2)
    end
  end
  return job
end

-- A uvmrec command writing OUT (a file "before\n" in a folder of its own) through OUT.tmp-XXXXXX,
-- stopped by SIGTERM and then, run again, by SIGINT as soon as that temporary file is there:
-- each must exit 128 + the signal with OUT as it was, no temporary file left and no traceback.
-- args(out): the command's arguments (quoted) for OUT.  Returns the outputs by signal ("TERM",
-- "INT") and OUT.  Needs M.can_background().
function M.interrupted_writes(args, name)
  local lib, assert = require "uvmrec.lib", require "luassert"
  local dir, logs = M.tmpdir(), M.tmpdir()
  local out_path, outs = dir .. "/" .. name, {}
  M.spit(out_path, "before\n")
  for _, c in ipairs { { "TERM", 143 }, { "INT", 130 } } do
    local job = M.background(M.quote(M.bin()) .. " " .. args(M.quote(out_path)), logs .. "/" .. c[1])
    local t0 = M.now()
    while #lib.dir_list(dir, name .. ".tmp-", "") == 0 and M.now() - t0 < 30 do M.sleep(0.01) end
    assert(os.execute("kill -" .. c[1] .. " " .. job.pid) == 0)
    local out, code = job:wait(60)
    assert.equal(c[2], code, out)
    assert.is_nil(out:find("traceback", 1, true), out)
    assert.equal("before\n", slurp(out_path), "OUT as it was")
    assert.same({ name }, lib.dir_list(dir, "", ""), "no temporary file left")
    outs[c[1]] = out
  end
  M.rmdir(logs)
  return outs, out_path
end

-- What a terminal shows, roughly: carriage returns, escape sequences and bells removed.
local function plain(s)
  return (s:gsub("\27%[[%d;?]*[%a@]", ""):gsub("\27[%(%)][%w]", ""):gsub("[\r\7]", ""))
end

local Session = {}
Session.__index = Session

-- Starts the command on a pseudo-terminal, with HOME a fresh folder (for the history file):
-- what is sent goes to the terminal as keys, what the program writes is polled from a file.
function M.pty(args)
  local dir = M.tmpdir()
  -- The exit code is written from outside the terminal: a shell on it would get Ctrl-C's SIGINT
  -- too, and dash (sh) dies of it.
  local inner = "exec " .. M.quote(M.bin()) .. " " .. (args or "")
  local out = M.quote(dir .. "/out")
  local cmd = ("HOME=%s TERM=dumb timeout 120 script -q -e -c %s /dev/null > %s 2>&1; echo __exit=$? >> %s")
    :format(M.quote(dir), M.quote(inner), out, out)
  return setmetatable({ dir = dir, p = io.popen(cmd, "w"), pos = 1 }, Session)
end

function Session:send(keys)
  self.p:write(keys)
  self.p:flush()
  return self
end

function Session:screen() return plain(slurp(self.dir .. "/out") or "") end

-- Waits for a Lua pattern in what the program wrote after the last match, and returns the
-- text up to the end of the match.
function Session:expect(pattern, timeout)
  local t0 = M.now()
  repeat
    local text = self:screen()
    local a, b = text:find(pattern, self.pos)
    if a then
      local seen = text:sub(self.pos, b)
      self.pos = b + 1
      return seen
    end
    M.sleep(0.05)
  until M.now() - t0 > (timeout or 15)
  error(("pty: %q did not appear in %ss; after the last match the terminal shows:\n%s"):format(
    pattern, timeout or 15, self:screen():sub(self.pos)), 2)
end

-- Ends the session (end of input) and returns the command's exit code and the whole output;
-- the session's HOME stays until remove().
function Session:close()
  if self.p then
    self.p:close()
    self.p = nil
  end
  local text = self:screen()
  return tonumber(text:match("__exit=(%d+)")), text
end

function Session:remove()
  self:close()
  M.rmdir(self.dir)
end

return M
