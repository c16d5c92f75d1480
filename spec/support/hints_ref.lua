-- The hint policies' test bench on the CPU (spec/hints_spec.lua, spec/hints/*_spec.lua): managed
-- tables there are host memory whose hints the engine validates and records, so what a policy
-- chose is read back from the hint log and the engine's record.
local ur = require "uvmrec"
local R = require "tbe_ref"

local EBC = ur.nn.EmbeddingBagCollection

local M = { PAGE = 4096 } -- the hint page the specs use (the default)

-- Two managed tables: a (8192 rows of 64 bytes, rowwise Adagrad's 4-byte state beside) and b.
function M.tables()
  return EBC { tables = { { name = "a", rows = 8192, dim = 16 }, { name = "b", rows = 2048, dim = 32 } },
               device = "cpu", placement = "managed", optimizer = { "rowwise_adagrad", lr = 0.1 }, seed = 2 }
end

-- One forward: feature t reads each id of hot[t] `times` times (one id a bag); the shorter
-- feature is padded with reads of id 0 (features of a batch have the same number of bags).
function M.feed(m, hot, times)
  local na, nb = #hot[1] * times, #hot[2] * times
  local B = math.max(na, nb)
  local vals, offs = {}, { 0 }
  for t, n in ipairs { na, nb } do
    local ids = hot[t]
    for i = 1, B do
      if i <= n then vals[#vals + 1] = ids[(i - 1) % #ids + 1] else vals[#vals + 1] = 0 end
      offs[#offs + 1] = #vals
    end
  end
  m:forward { values = R.tensor(vals, "i64"), offsets = R.tensor(offs, "i64") }
end

-- The log's records since `since`: {kind, advice, location, tensor (id), b0, b1 (bytes)}.
function M.log_since(since)
  local out = {}
  for _, r in ipairs(ur.hint_log(since)) do
    out[#out + 1] = { kind = r.kind, advice = r.advice, location = r.location, tensor = r.tensor_id,
                      b0 = r.range.byte_begin, b1 = r.range.byte_end }
  end
  return out
end

-- The sequence number of the log's last record (0 when empty).
function M.last_seq()
  local l = ur.hint_log()
  return #l > 0 and l[#l].seq or 0
end

-- M.tables() under a hints manager with opts, started at step 0: the tables, the manager, and
-- the log's last record before the manager was made (what it hinted since: log_since(seq)).
function M.started(opts)
  local hints = require "uvmrec.hints"
  local m = M.tables()
  local seq = M.last_seq()
  local mgr = hints.manager(m, opts)
  mgr:start(0)
  return m, mgr, seq
end

return M
