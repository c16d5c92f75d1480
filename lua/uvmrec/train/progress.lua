-- Training progress: on a terminal one line redrawn in place (step, a bar, samples/s, loss,
-- ETA); on a pipe or a file plain lines every print_every steps, which logs and tests can read.
-- Messages (evaluations) go between, the bar redrawn under them.
local ur = require "uvmrec"
local C = ur.C

local M = {}
local Progress = {}
Progress.__index = Progress

-- opts: total (steps, or nil when unknown), mode ("auto": a bar on a terminal, else lines;
-- "bar", "lines", "none"), out (a file, io.stdout), fd (of out, 1), print_every (steps), samples
-- (trained before it starts: a resumed run's, left out of its samples/s).
function M.new(opts)
  opts = opts or {}
  local mode = opts.mode or "auto"
  local cols = C.ur_term_columns(opts.fd or 1)
  if mode == "auto" then mode = cols > 0 and "bar" or "lines" end
  if mode ~= "bar" and mode ~= "lines" and mode ~= "none" then
    error("progress: mode '" .. tostring(mode) .. "' is not auto, bar, lines or none", 2)
  end
  local total = opts.total
  local every = opts.print_every or 0
  if every == 0 then every = total and math.max(1, math.floor(total / 10)) or 100 end
  return setmetatable({ mode = mode, out = opts.out or io.stdout, total = total, cols = cols > 0 and cols or 80,
                        print_every = every, t0 = ur.C.ur_clock_seconds(), last_t = 0, last_samples = opts.samples or 0,
                        printed = 0,
                        rate = nil, loss = nil, shown = false }, Progress)
end

-- h:mm:ss, or m:ss under an hour.
function M.duration(s)
  if not s or s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  local h, m = math.floor(s / 3600), math.floor(s / 60) % 60
  if h > 0 then return ("%d:%02d:%02d"):format(h, m, s % 60) end
  return ("%d:%02d"):format(m, s % 60)
end

-- "1 step", "2 steps", "0 samples": a whole count and its noun, plural but for 1 (lib.things).
M.things = require("uvmrec.lib").things

-- 18.2k, 1.35M: three digits (999.7 rounds to 1k, not to 1e+03).
local UNITS = { { 1e9, "G" }, { 1e6, "M" }, { 1e3, "k" } }
function M.count(n)
  for _, u in ipairs(UNITS) do
    if n >= u[1] * 0.9995 then return ("%.3g%s"):format(n / u[1], u[2]) end
  end
  return ("%.3g"):format(n)
end

-- 512 B, 1.7 MiB, 6.25 GiB.
function M.bytes(n)
  if n >= 2 ^ 30 then return ("%.3g GiB"):format(n / 2 ^ 30) end
  if n >= 2 ^ 20 then return ("%.3g MiB"):format(n / 2 ^ 20) end
  if n >= 2 ^ 10 then return ("%.3g KiB"):format(n / 2 ^ 10) end
  return ("%d B"):format(n)
end

-- Training time so far, leaving out what pause() .. resume() held (evaluations).
function Progress:elapsed()
  return C.ur_clock_seconds() - self.t0 - (self.paused or 0)
end

function Progress:pause() self.pause_t = C.ur_clock_seconds() end
function Progress:resume()
  if self.pause_t then
    self.paused = (self.paused or 0) + C.ur_clock_seconds() - self.pause_t
    self.pause_t = nil
  end
end

local function fields(self, step)
  local parts = { self.total and ("step %d/%d"):format(step, self.total) or ("step %d"):format(step) }
  local rest = {
    self.rate and (M.count(self.rate) .. " samples/s") or "- samples/s",
    self.loss and ("loss %.4f"):format(self.loss) or "loss -",
  }
  -- a note the trainer sets (managed collisions' share of resident lookups)
  if self.note then rest[#rest + 1] = self.note end
  rest[#rest + 1] = "ETA " .. ((self.total and self.rate and self.rate > 0)
    and M.duration((self.total - step) * self.samples_per_step / self.rate) or "?")
  return parts, rest
end

-- After step `step` with `samples` seen in all and the loss just read.  Samples/s is over the
-- time since the previous update (or the start), which waited for the GPU as this one did.  A
-- line is written at the first update at or past each multiple of print_every (the loss is read
-- every train.log_every steps, which print_every need not be a multiple of).
function Progress:update(step, loss, samples)
  local t = self:elapsed()
  if t > self.last_t then self.rate = (samples - self.last_samples) / (t - self.last_t) end
  self.samples_per_step = samples / math.max(step, 1)
  self.last_t, self.last_samples = t, samples
  -- A moving average: the loss of one batch is noisy.
  if loss then self.loss = self.loss and (0.7 * self.loss + 0.3 * loss) or loss end
  self.step = step
  if self.mode == "bar" then
    self:draw(step)
  elseif self.mode == "lines" and (math.floor(step / self.print_every) > math.floor(self.printed / self.print_every)
                                   or step == self.total) then
    self.printed = step
    local head, rest = fields(self, step)
    self.out:write(head[1], "  ", table.concat(rest, "  "), "\n")
    self.out:flush()
  end
end

function Progress:draw(step)
  local head, rest = fields(self, step)
  local tail = " " .. table.concat(rest, " | ")
  local width = self.cols - 1 - #head[1] - #tail - 9
  local bar = ""
  if self.total and width >= 10 then
    width = math.min(width, 40)
    local frac = math.min(step / self.total, 1)
    local fill = math.floor(frac * width + 0.5)
    bar = (" [%s%s] %3d%%"):format(("#"):rep(fill), ("."):rep(width - fill), math.floor(frac * 100))
  end
  self.out:write("\r\27[K", head[1], bar, tail)
  self.out:flush()
  self.shown = true
end

-- A line of its own (an evaluation), above the bar.
function Progress:message(text)
  if self.mode == "none" then return end
  if self.mode == "bar" and self.shown then self.out:write("\r\27[K") end
  self.out:write(text, "\n")
  if self.mode == "bar" and self.step and not self.done then self:draw(self.step) end
  self.out:flush()
end

-- Ends the bar's line; later messages are lines of their own.
function Progress:finish()
  self.done = true
  if self.mode == "bar" and self.shown then
    self.out:write("\n")
    self.out:flush()
    self.shown = false
  end
end

return M
