-- The synthetic data path at many tables: the generator on the CPU and the threaded loader
-- from it, T one-hot Zipf(1.05) tables of 100,000 rows, CPU time a sample (it grows with the
-- ids a sample, T of them, and with nothing else of T).
-- usage: uvmrec scripts/bench/wide_data.lua [TABLES] [BATCH] [BATCHES]
local ur = require "uvmrec"
local data = ur.data

local args = require("uvmrec.cli").command {
  name = "scripts/bench/wide_data.lua",
  summary = "the synthetic generator and the loader from it at many tables: CPU time a sample",
  { "[TABLES]", "one-hot tables", type = "whole", default = 1000 },
  { "[BATCH]", "samples a batch", type = "whole", default = 4096 },
  { "[BATCHES]", "batches the loader makes", type = "whole", default = 20 },
}:parse(arg)
local T, B, N = args.tables, args.batch, args.batches
local tabs = {}
for t = 1, T do tabs[t] = { name = "C" .. t, rows = 100000, zipf = 1.05 } end
local spec = { num_dense = 13, seed = 1, tables = tabs }
local s = data.synthetic_spec(spec)
local c0 = os.clock()
for i = 0, 4 do assert(data.generate(s, i * B, B)) end
local gen = os.clock() - c0
print(("generate: %d tables, %d samples in %.2f CPU s: %.0f samples a CPU-second"):format(T, 5 * B, gen, 5 * B / gen))
local l = assert(data.loader { data = { kind = "synthetic", spec = spec }, samples = N * B, batch_size = B })
c0 = os.clock()
local got, b = 0, l:next()
while b do
  got = got + b.size
  b = l:next()
end
local lc = os.clock() - c0
l:close()
print(("loader: %d tables, %d batches of %d in %.2f CPU s (the process): %.0f samples a CPU-second")
  :format(T, got / B, B, lc, got / lc))
