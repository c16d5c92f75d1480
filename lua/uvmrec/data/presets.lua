-- Synthetic data presets, by name.  Each is a plain table (see uvmrec.data.synthetic for the
-- fields); table sizes follow the public DLRM configurations.
local M = {}

-- Criteo Kaggle (Display Advertising Challenge) categorical cardinalities, C1..C26.
M.kaggle_rows = { 1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                  27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572 }
-- Criteo 1TB with ids capped at 40M rows (MLPerf DLRM v1, --max-ind-range=40000000).
M.mlperf_rows = { 39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546,
                  403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935,
                  12972, 108, 36 }
-- MLPerf DCNv2 multi-hot sizes per table.
M.dcnv2_hot = { 3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1 }
-- Small tables for tests: every size class from a handful of rows to ten thousand.
M.tiny_rows = { 4, 10, 1000, 500, 30, 8, 200, 50, 3, 2000, 100, 5000, 60, 12, 300, 10000, 6, 150,
                80, 4, 7000, 15, 9, 400, 40, 120 }

local function tables(rows, opts)
  local t = {}
  for i, r in ipairs(rows) do
    t[i] = { name = "C" .. i, rows = r, zipf = opts.zipf or 1.05,
             hot = opts.hot and opts.hot[i] or 1 }
  end
  return t
end

local function capped(rows, cap)
  local out = {}
  for i, r in ipairs(rows) do out[i] = math.min(r, cap) end
  return out
end

M.tiny = { name = "tiny", num_dense = 13, seed = 1234, bias = -1.2, dense_signal = 0.08,
           signal_total = 2.6, tables = tables(M.tiny_rows, { zipf = 1.05 }) }
M.kaggle = { name = "kaggle", num_dense = 13, seed = 1234, bias = -1.2, dense_signal = 0.08,
             signal_total = 2.6, tables = tables(M.kaggle_rows, {}) }
M.mlperf_v1 = { name = "mlperf_v1", num_dense = 13, seed = 1234, bias = -1.2, dense_signal = 0.08,
                signal_total = 2.6, tables = tables(M.mlperf_rows, {}) }
M.mlperf_v1_2m = { name = "mlperf_v1_2m", num_dense = 13, seed = 1234, bias = -1.2,
                   dense_signal = 0.08, signal_total = 2.6,
                   tables = tables(capped(M.mlperf_rows, 2000000), {}) }
M.dcnv2 = { name = "dcnv2", num_dense = 13, seed = 1234, bias = -1.2, dense_signal = 0.08,
            signal_total = 2.6, tables = tables(M.mlperf_rows, { hot = M.dcnv2_hot }) }

-- The tiny tables multi-hot: 0 to 6 ids a bag (empty bags too), every third table weighted.
M.tiny_multihot = { name = "tiny_multihot", num_dense = 13, seed = 4321, bias = -1.2, dense_signal = 0.08,
                    signal_total = 2.6, tables = tables(M.tiny_rows, { zipf = 1.05 }) }
for i, t in ipairs(M.tiny_multihot.tables) do
  t.hot = { (i - 1) % 2, 1 + i % 6 }
  t.weighted = i % 3 == 0
end

M.names = { "tiny", "kaggle", "mlperf_v1", "mlperf_v1_2m", "dcnv2", "tiny_multihot" }

return M
