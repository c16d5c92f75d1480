-- Progress output: a bar redrawn in place on a terminal (a pseudo-terminal made by script(1)),
-- plain lines on a pipe, through `uvmrec train`; the formatting helpers; the command's errors.
local cmd = require "command"
local progress = require "uvmrec.train.progress"

local q = cmd.quote
local RUN = "train dlrm_tiny --cpu --steps 40 --set train.batch_size=256 --set eval.samples=4096 " ..
            "--set eval.every=20 --set eval.batch_size=4096 --set train.print_every=10"

-- A writable stand-in for io.stdout that keeps what is written.
local function sink()
  local s = { text = {} }
  function s:write(...) for _, x in ipairs { ... } do self.text[#self.text + 1] = x end return self end
  function s.flush() end
  function s:all() return table.concat(self.text) end
  return s
end

describe("uvmrec.train.progress", function()
  it("formats durations, counts and sizes", function()
    assert.same({ "0:07", "1:05", "2:00:01", "?" },
                { progress.duration(7.2), progress.duration(65), progress.duration(7201), progress.duration(1 / 0) })
    assert.same({ "950", "18.2k", "1.35M", "1k", "7.86G" },
                { progress.count(950), progress.count(18234), progress.count(1.35e6), progress.count(999.7),
                  progress.count(7.86e9) })
    assert.same({ "160 B", "1.7 MiB", "6.25 GiB" },
                { progress.bytes(160), progress.bytes(1.7 * 2 ^ 20), progress.bytes(6.25 * 2 ^ 30) })
    assert.same({ "0 steps", "1 step", "2 steps", "1 held-out sample" },
                { progress.things(0, "step"), progress.things(1, "step"), progress.things(2, "step"),
                  progress.things(1, "held-out sample") })
  end)

  it("draws one line in place as a bar, with messages above it", function()
    local out = sink()
    local p = progress.new { total = 100, mode = "bar", out = out }
    p:update(10, 0.69, 10240)
    p:message("eval at step 10: AUC 0.7")
    p:update(20, 0.5, 20480)
    p:finish()
    local text = out:all()
    assert.matches("^\r\27%[Kstep 10/100 %[#+%.+%]  10%% [%d.]+[kMG]? samples/s | loss 0%.6900 | ETA %d+:%d%d", text)
    assert.matches("\r\27%[Keval at step 10: AUC 0%.7\n\r\27%[Kstep 10/100 ", text)
    -- the loss shown is smoothed: 0.7 * 0.69 + 0.3 * 0.5
    assert.matches("\r\27%[Kstep 20/100 %[#+%.+%]  20%% [^\n]* loss 0%.6330 [^\n]*\n$", text)
  end)

  it("writes plain lines every print_every steps when not on a terminal", function()
    local out = sink()
    local p = progress.new { total = 30, mode = "auto", out = out, fd = -1, print_every = 10 }
    assert.equal("lines", p.mode)
    for s = 1, 30 do p:update(s, 0.5, s * 64) end
    p:message("eval")
    local text = out:all()
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(4, #lines)
    assert.matches("^step 10/30  [%d.]+[kMG]? samples/s  loss 0%.5000  ETA %d+:%d%d$", lines[1])
    assert.matches("^step 30/30 ", lines[3])
    assert.equal("eval", lines[4])
    assert.is_nil(text:find("[\r\27]"))
    assert.has_error(function() progress.new { mode = "fancy" } end,
                     "progress: mode 'fancy' is not auto, bar, lines or none")
  end)

  it("writes a line at the first update past each multiple of print_every, whatever the updates' steps", function()
    local out = sink()
    local p = progress.new { total = 70, mode = "lines", out = out, print_every = 15 }
    for s = 10, 70, 10 do p:update(s, 0.5, s * 64) end -- the loss read every 10 steps (train.log_every)
    local steps = {}
    for s in out:all():gmatch("step (%d+)/70") do steps[#steps + 1] = tonumber(s) end
    assert.same({ 20, 30, 50, 60, 70 }, steps)
  end)

  it("counts samples/s from the samples it starts at (a resumed run's), not from 0", function()
    local p = progress.new { total = 200, mode = "none", samples = 102400 }
    p.t0 = p.t0 - 2 -- started 2 s ago: 10240 samples since then give at most 5120 samples/s
    p:update(110, 0.5, 112640)
    assert.is_true(p.rate > 0 and p.rate <= 5120, tostring(p.rate))
  end)

  describe("through uvmrec train", function()
    it("prints plain lines on a pipe", function()
      local dir = cmd.tmpdir()
      local out, err, code = cmd.run(RUN .. " --out " .. q(dir .. "/run"))
      assert.equal(0, code, err)
      assert.truthy(cmd.slurp(dir .. "/run/config.json"))
      assert.matches("^{\"data\":", cmd.slurp(dir .. "/run/metrics.jsonl"))
      cmd.rmdir(dir)
      assert.is_nil(out:find("[\r\27]"), "no carriage returns or escapes on a pipe")
      assert.matches("^uvmrec train: dlrm_tiny on the CPU\nmodel: DLRM: 13 dense %-> bottom 64%-16;", out)
      assert.matches("\ndata: synthetic:tiny: 10240 samples an epoch; evaluation on 4096 held%-out samples %(from "
                     .. "sample 2%^48%)\n", out)
      for _, s in ipairs { 10, 20, 30, 40 } do
        assert.matches("\nstep " .. s .. "/40  [%d.]+[kMG]? samples/s  loss %d%.%d%d%d%d  ETA %d+:%d%d\n", out)
      end
      assert.matches("\neval at step 20: AUC %d%.%d+  NE %d%.%d+  logloss %d%.%d+  accuracy %d%.%d+  "
                     .. "calibration %d%.%d+  CTR %d%.%d+  %(4096 samples, [%d.]+ s%)\n", out)
      assert.matches("\ntrained 40 steps, 10240 samples in [%d.]+ s: [%d.]+[kMG]? samples/s\n", out)
      assert.matches("\nfinal AUC %d%.%d+ %(the synthetic data's hidden%-model ceiling: 0%.8%d+%)\n", out)
    end)

    it("says one step and one sample in the singular", function()
      -- "trained 1 steps, 1 samples", "1 samples an epoch; evaluation on 1 held-out samples"
      local dir = cmd.tmpdir()
      local base = "train dlrm_tiny --cpu --progress none --set train.batch_size=1 --set eval.min_auc=0 "
        .. "--set eval.samples=1 --set eval.batch_size=1 --set data.samples=2 --checkpoint-every 1 --out "
        .. q(dir .. "/r")
      local out, err, code = cmd.run(base .. " --steps 1")
      assert.equal(0, code, err)
      assert.matches("\ndata: synthetic:tiny: 2 samples an epoch; evaluation on 1 held%-out sample %(from ", out)
      assert.matches("\ntrained 1 step, 1 sample in [%d.]+ s: ", out)
      local said = cmd.run("eval dlrm_tiny --cpu --set eval.samples=1 --set eval.batch_size=1 --set train.batch_size=1 "
        .. "--checkpoint " .. q(dir .. "/r"))
      assert.matches("\neval: AUC [^\n]*%(1 sample, [%d.]+ s%)\n", said)
      out, err, code = cmd.run(base .. " --steps 2 --resume " .. q(dir .. "/r"))
      assert.equal(0, code, err)
      assert.matches("\nresumed from [^\n]* at step 1 %(1 sample trained; ", out)
      -- the rate as progress.count writes it: 850, 1.18k, ...
      assert.matches("\ntrained step 2, 1 sample in [%d.]+ s: [%d.]+[kMG]? samples/s %(2 samples in all%)\n", out)
      cmd.rmdir(dir)
    end)

    it("draws a bar in place on a terminal", function()
      assert.is_true(cmd.have("script"), "script(1) from util-linux")
      local s = cmd.pty(RUN)
      s:expect("final AUC", 120)
      local code, screen = s:close()
      local raw = cmd.slurp(s.dir .. "/out")
      s:remove()
      assert.equal(0, code, screen)
      assert.matches("\r\27%[Kstep 40/40 %[#+%] 100%% [%d.]+[kMG]? samples/s | loss %d%.%d+ | ETA 0:00", raw)
      assert.matches("\r\27%[Kstep 20/40 %[#+%.+%]  50%%", raw)
      -- the evaluation gets a line of its own, the bar is drawn again under it
      assert.matches("\r\27%[Keval at step 20: AUC [^\r\n]+\r?\n\r\27%[Kstep 20/40 ", raw)
      assert.is_nil(raw:find("\nstep 10/40  "), "no plain lines on a terminal")
    end)

    it("fails with the config's position, and below eval.min_auc", function()
      local dir = cmd.tmpdir()
      cmd.spit(dir .. "/bad.yaml", "model: {bottom_mlp: [4], top_mlp: [1]}\nembeddings: {dim: 4, rows: [3]}\n"
        .. "optimizer: {lr: 0.1}\ntrain: {batch_size: many}\n")
      local out, err, code = cmd.run("train " .. q(dir .. "/bad.yaml"))
      assert.equal(1, code)
      assert.equal("", out)
      assert.equal("uvmrec train: " .. dir .. "/bad.yaml:4:21: train.batch_size: 'many' is not a decimal "
                   .. "integer\n", err)
      out, err, code = cmd.run("train dlrm_tiny --set train.bach=1")
      assert.equal(1, code)
      assert.equal("", out)
      assert.equal("uvmrec train: --set train.bach=1: 'train.bach' is not a setting\n", err)
      out, err, code = cmd.run("train dlrm_tiny --progress fancy")
      assert.equal(2, code)
      assert.equal("", out)
      assert.matches("^uvmrec train: %-%-progress: 'fancy' is not auto, bar, lines or none\nusage: uvmrec train ", err)
      out, err, code = cmd.run("train --frobnicate")
      assert.equal(2, code)
      assert.equal("", out)
      assert.matches("^uvmrec train: unknown option '%-%-frobnicate'\nusage: uvmrec train ", err)
      out, err, code = cmd.run("train dlrm_tiny --cpu --steps 3 --set train.batch_size=64 --set eval.samples=512 "
        .. "--set eval.min_auc=0.99")
      assert.equal(1, code, err)
      assert.matches("\nfinal AUC 0%.%d+", out)
      assert.matches("^uvmrec train: the final AUC 0%.%d+ is below eval.min_auc 0%.9900\n$", err)
      cmd.rmdir(dir)
    end)
  end)
end)
