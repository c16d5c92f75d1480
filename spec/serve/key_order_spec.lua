-- Matching a request's keys to a model's features (ur_model_predict's check, engine/src/data/kjt.c
-- ur__kjt_key_order): keys in the model's order cost one comparison a feature, any other order
-- about n log n, not a scan of the request per feature (n^2 / 2: 2 million comparisons a predict
-- for 2000 features).  Counted by $(BUILD)/bin/key_order (spec/support/key_order.c), the engine
-- linked with strcmp wrapped; serve_spec checks the scores of a request in another order.
local command = require "command"
local h = require "helpers"

describe("uvmrec.serve matching a request's keys to the model's features", function()

  it("spends n comparisons on keys in order and about n log n on shuffled ones", function()
    local p = h.test_program("key_order")
    if not p then return end
    for _, n in ipairs { 26, 1000, 2000 } do
      local out, err, code = command.sh(command.quote(p) .. " " .. n)
      assert.equal(0, code, out .. err)
      local got = {}
      for what, k, c, verdict in out:gmatch("(%S+) (%d+) (%d+) (%S+)\n") do
        assert.equal("ok", verdict, out)
        assert.equal(n, tonumber(k))
        got[what] = tonumber(c)
      end
      assert.equal(n, got.in_order)
      local bound = 3 * n * math.ceil(math.log(n) / math.log(2))
      for _, what in ipairs { "shuffled", "missing" } do
        assert(got[what] and got[what] <= bound,
          ("%s keys of %d: %s comparisons; expected at most %d (3 n log2 n)"):format(what, n, tostring(got[what]),
            bound))
      end
    end
  end)
end)
