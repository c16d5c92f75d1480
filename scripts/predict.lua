-- `uvmrec predict`: scores data with an exported model file through the serving API (the calls
-- engine/examples/serve.c makes): one probability a line, in the data's order.  Synthetic data
-- gives the training run's held-out samples (those its final evaluation scored); Criteo TSV and
-- day files are read whole, raw ids mapped by the model.  Its options are declared below
-- (`uvmrec predict --help`).
local serve = require "uvmrec.serve"

local cmd = require("uvmrec.cli").command {
  name = "predict",
  summary = "score data with an exported model file: one probability a line",
  { "MODEL", "a model file (uvmrec export)" },
  { "--data SPEC", "synthetic:NAME (the training run's held-out samples), criteo-tsv:PATH[,PATH...] or "
    .. "criteo-bin:DIR; default: the held-out samples of the model's training run" },
  { "--out FILE", "where the probabilities go (default: standard output)" },
  { "--batch-size N", "samples a call", type = "whole", min = 1, default = 512 },
  { "--samples N", "score at most N samples", type = "whole", min = 1 },
  { "--placement WHERE", "where the tables live", choices = { "device", "managed", "host" } },
  { "--bounds MODE", "ids outside their table after the mapping", choices = { "fatal", "warn", "off" },
    default = "fatal" },
  { "--cpu", "serve on the CPU even where a GPU is" },
}
local o = cmd:parse(arg)
local m, err = serve.open(o.model, { device = o.cpu and "cpu" or nil, placement = o.placement, bounds = o.bounds })
if not m then cmd:fail(err) end
local lopts, what = serve.data(m, o.data, { batch_size = o.batch_size, samples = o.samples })
if not lopts then cmd:fail(what) end
-- SIGINT and SIGTERM stop the scoring between batches (cmd:catch_signals), the temporary file
-- below removed; caught before that file exists.  A second signal, or SIGKILL, ends the process
-- at once: that leaves the temporary file, never FILE.
local lib = require "uvmrec.lib"
local signals = cmd:catch_signals()
-- A file is written beside itself, under a name of its own (never a fixed one, which could be
-- another file's: the model's), and renamed when every sample scored: a run that fails half
-- way leaves no file that looks like an answer (nor changes one that was there).
local out, tmp = io.stdout, nil
if o.out then
  -- a folder there, or none to hold it, would refuse the scores only after the work
  local can, why = lib.file_target(o.out)
  if not can then cmd:fail(("--out %s: %s"):format(o.out, why)) end
  if lib.same_file(o.out, o.model) then
    cmd:fail(("--out %s is the model file it scores with; give another file"):format(o.out))
  end
  local terr, ferr
  tmp, terr = lib.temp_file(o.out)
  if not tmp then cmd:fail(("--out %s: %s"):format(o.out, terr)) end
  out, ferr = io.open(tmp, "w")
  if not out then
    os.remove(tmp)
    cmd:fail(("--out %s: %s"):format(o.out, ferr))
  end
end
-- The loader reads files in whole batches: the last may go past --samples.
local written = 0
local n, serr = serve.score(m, lopts, function(_, p)
  local v = p:totable()
  local k = o.samples and math.min(#v, o.samples - written) or #v
  for i = 1, k do out:write(("%.9g\n"):format(v[i])) end
  written = written + k
end, { samples = o.samples })
if signals.caught() then n = nil end
if tmp then
  local ok, cerr = out:close()
  if n and not ok then n, serr = nil, ("%s: %s"):format(tmp, tostring(cerr)) end
  if n then
    local renamed, rerr = os.rename(tmp, o.out)
    if not renamed then n, serr = nil, rerr end
  end
  if not n then os.remove(tmp) end
end
-- (a signal after the check above, once FILE is renamed into place, finds it written)
signals.finish((" after %d samples%s"):format(written, not o.out and ""
  or n and ("; %s was written before it stopped"):format(o.out)
  or ("; %s not written (its temporary file removed)"):format(o.out)))
if not n then cmd:fail(serr) end
if o.out then print(("predict: %d samples of %s -> %s"):format(written, what, o.out)) end
m:close()
