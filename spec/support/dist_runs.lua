-- Two run directories of `uvmrec train` (one process, and the same command over ranks) compared:
-- the same `train` events (step, samples) with each loss within 1e-5 relative, the same `eval`
-- events (step, samples scored) with each AUC within 1e-3, and the `final` AUC within 1e-3
-- (docs/distributed.md).  A module for spec/dist/train_spec.lua (compare(a, b)
-- returns the worst loss difference, or nil and why not), and a script for scripts/bench/
-- dist_gpu.sh: `uvmrec spec/support/dist_runs.lua RUN_ONE RUN_RANKS` prints the worst difference
-- and exits 1 on a mismatch.
local json = require "uvmrec.json"

local M = { LOSS_TOL = 1e-5, AUC_TOL = 1e-3 }

-- A run directory's train events, its final event and its eval events, or nil, why.
function M.events(dir)
  local f = io.open(dir .. "/metrics.jsonl", "rb")
  if not f then return nil, "no " .. dir .. "/metrics.jsonl" end
  local train, final, evals = {}, nil, {}
  for line in f:lines() do
    local e = json.decode(line)
    if e.event == "train" then train[#train + 1] = e end
    if e.event == "eval" then evals[#evals + 1] = e end
    if e.event == "final" then final = e end
  end
  f:close()
  if not final then return nil, dir .. "/metrics.jsonl has no final event" end
  return train, final, evals
end

function M.compare(one, ranks)
  local a, fa, ea = M.events(one)
  if not a then return nil, fa end
  local b, fb, eb = M.events(ranks)
  if not b then return nil, fb end
  if #ea ~= #eb then return nil, ("%d eval events in %s, %d in %s"):format(#ea, one, #eb, ranks) end
  for i = 1, #ea do
    local x, y = ea[i], eb[i]
    if x.step ~= y.step or x.samples ~= y.samples or math.abs((x.auc or 0) - (y.auc or 0)) > M.AUC_TOL then
      return nil, ("eval event %d: step %s, %s samples, AUC %s in %s; step %s, %s samples, AUC %s in %s"):format(i,
        tostring(x.step), tostring(x.samples), tostring(x.auc), one, tostring(y.step), tostring(y.samples),
        tostring(y.auc), ranks)
    end
  end
  if #a == 0 or #a ~= #b then
    return nil, ("%d train events in %s, %d in %s"):format(#a, one, #b, ranks)
  end
  local worst = 0
  for i = 1, #a do
    if a[i].step ~= b[i].step or a[i].samples ~= b[i].samples then
      return nil, ("train event %d: step %d, %d samples in %s; step %d, %d samples in %s"):format(i, a[i].step,
        a[i].samples, one, b[i].step, b[i].samples, ranks)
    end
    local d = math.abs(a[i].loss - b[i].loss) / math.abs(a[i].loss)
    if d > M.LOSS_TOL then
      return nil, ("step %d: loss %.9g over the ranks, %.9g in one process (%.3g relative)"):format(a[i].step,
        b[i].loss, a[i].loss, d)
    end
    worst = math.max(worst, d)
  end
  if not (fa.auc and fb.auc) then return nil, "a run without a final AUC" end
  if math.abs(fa.auc - fb.auc) > M.AUC_TOL then
    return nil, ("final AUC %.6f over the ranks, %.6f in one process"):format(fb.auc, fa.auc)
  end
  return worst, a, b
end

if arg and arg[0] and arg[0]:match("dist_runs%.lua$") and arg[1] then
  local worst, err = M.compare(arg[1], arg[2])
  if not worst then
    io.stderr:write("dist_runs: ", err, "\n")
    os.exit(1)
  end
  print(("dist_runs: the same steps; losses within %.3g relative at worst; final AUC within %g"):format(worst,
    M.AUC_TOL))
end

return M
