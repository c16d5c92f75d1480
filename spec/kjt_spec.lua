local ur = require "uvmrec"
local h = require "helpers"

-- A plain reference: per key, a list of bags (each a list of ids and a list of weights).
local function random_ref(rng, nkeys, stride, weighted, maxlen)
  local ref = { keys = {}, stride = stride, bags = {}, weighted = weighted }
  for k = 1, nkeys do
    ref.keys[k] = "k" .. k .. "_" .. rng(1000)
    ref.bags[k] = {}
    local empty_key = rng(5) == 1 -- a key with no values at all
    for b = 1, stride do
      local n = empty_key and 0 or rng(maxlen + 1) - 1
      local bag = { ids = {}, w = {} }
      for i = 1, n do
        bag.ids[i] = rng(6) - 1 -- few distinct ids, so dedup finds repeats
        bag.w[i] = rng(4) / 4
      end
      ref.bags[k][b] = bag
    end
  end
  return ref
end

local function flatten(ref)
  local values, lengths, weights = {}, {}, {}
  for k = 1, #ref.keys do
    for b = 1, ref.stride do
      local bag = ref.bags[k][b]
      lengths[#lengths + 1] = #bag.ids
      for i = 1, #bag.ids do
        values[#values + 1] = bag.ids[i]
        weights[#weights + 1] = bag.w[i]
      end
    end
  end
  local offsets = { 0 }
  for i, l in ipairs(lengths) do offsets[i + 1] = offsets[i] + l end
  return values, lengths, ref.weighted and weights or nil, offsets
end

local function make(ref)
  local values, lengths, weights = flatten(ref)
  return assert(ur.KJT { keys = ref.keys, values = values, lengths = lengths, weights = weights,
                         stride = ref.stride })
end

local function same(ref, kjt, what)
  local values, lengths, weights, offsets = flatten(ref)
  local t = kjt:totable()
  assert.same(ref.keys, t.keys, what)
  assert.equal(ref.stride, t.stride, what)
  assert.same(values, t.values, what)
  assert.same(lengths, t.lengths, what)
  assert.same(offsets, t.offsets, what)
  assert.same(weights, t.weights, what)
end

local rng_of = h.rng

-- A host tensor of a list.
local function tensor_of(list, dtype)
  local t = ur.tensor({ #list }, { dtype = dtype })
  for i, x in ipairs(list) do t[i - 1] = x end
  return t
end

local shapes = { { 3, 4 }, { 1, 1 }, { 5, 1 }, { 2, 7 }, { 4, 0 }, { 0, 3 } }

local function bag_key(bag)
  local parts = {}
  for i = 1, #bag.ids do parts[i] = bag.ids[i] .. "@" .. bag.w[i] end
  return table.concat(parts, ",")
end

describe("uvmrec.KJT", function()
  it("builds key-major offsets (the embedding kernels' bag offsets) from lengths", function()
    local k = ur.KJT { keys = { "a", "b" }, values = { 10, 11, 12, 13, 14 }, lengths = { 1, 0, 2, 2 } }
    assert.equal(2, k:stride())
    assert.same({ 0, 1, 1, 3, 5 }, k:offsets():totable())
    assert.equal("i64", k:offsets():dtype())
    assert.equal("i64", k:values():dtype())
    assert.equal("i32", k:lengths():dtype())
    assert.same({ bags = { 2, 4 }, values = { 1, 5 } }, k:key_span("b"))
    assert.same({ "a", "b" }, k:keys())
    assert.is_nil(k:weights())
    assert.equal("kjt 2 keys, stride 2, 5 values, host {a, b}", tostring(k))
  end)

  it("accepts tensors, sharing their storage, and outlives them", function()
    local v = ur.tensor({ 3 }, { dtype = "i64" })
    for i = 0, 2 do v[i] = 7 + i end
    local l = ur.tensor({ 3 }, { dtype = "i32" })
    l[0], l[1], l[2] = 2, 0, 1
    local k = ur.KJT { keys = { "x" }, values = v, lengths = l }
    assert.equal(3, k:stride())
    assert.equal(v:id(), k:values():id())
    v:free()
    l:free()
    assert.same({ 7, 8, 9 }, k:values():totable())
  end)

  it("matches the reference on random jagged inputs (empty bags, empty keys, batch of one)", function()
    for trial = 1, 30 do
      local rng = rng_of(trial)
      local shape = shapes[(trial - 1) % #shapes + 1]
      local ref = random_ref(rng, shape[1], shape[2], trial % 2 == 0, 3)
      local k = make(ref)
      same(ref, k, "construct " .. trial)
      assert.is_true(k:validate())

      -- permute: a random order with a repeat
      if #ref.keys > 0 then
        local order, rorder = {}, { keys = {}, stride = ref.stride, bags = {}, weighted = ref.weighted }
        for j = 1, #ref.keys + 1 do
          local src = rng(#ref.keys)
          order[j] = j % 2 == 0 and ref.keys[src] or src
          rorder.keys[j] = ref.keys[src]
          rorder.bags[j] = ref.bags[src]
        end
        same(rorder, k:permute(order), "permute " .. trial)
      end

      -- split into random segments, and concat them back
      local sizes = h.random_sizes(rng, #ref.keys)
      local parts = k:split(sizes)
      local k0 = 0
      for i, part in ipairs(parts) do
        local rp = { keys = {}, stride = ref.stride, bags = {}, weighted = ref.weighted }
        for j = 1, sizes[i] do
          rp.keys[j] = ref.keys[k0 + j]
          rp.bags[j] = ref.bags[k0 + j]
        end
        same(rp, part, "split " .. trial .. " part " .. i)
        k0 = k0 + sizes[i]
      end
      same(ref, ur.KJT.concat(parts), "concat " .. trial)

      -- to_dict
      local d = k:to_dict()
      for ki, key in ipairs(ref.keys) do
        local lens, vals, offs = {}, {}, { 0 }
        for b = 1, ref.stride do
          local bag = ref.bags[ki][b]
          lens[b] = #bag.ids
          offs[b + 1] = offs[b] + #bag.ids
          for i = 1, #bag.ids do vals[#vals + 1] = bag.ids[i] end
        end
        assert.same(lens, d[key].lengths:totable())
        assert.same(vals, d[key].values:totable())
        assert.same(offs, d[key].offsets:totable())
        assert.equal(ref.weighted, d[key].weights ~= nil)
      end

      -- dedup: distinct bags per key in order of first appearance; expand restores
      local v = k:dedup()
      local vt = v:totable()
      local bag0 = 0
      for ki = 1, #ref.keys do
        local seen, uniq, inv = {}, {}, {}
        for b = 1, ref.stride do
          local key = bag_key(ref.bags[ki][b])
          if not ref.weighted then key = table.concat(ref.bags[ki][b].ids, ",") end
          if not seen[key] then
            uniq[#uniq + 1] = ref.bags[ki][b]
            seen[key] = #uniq - 1
          end
          inv[b] = seen[key]
        end
        assert.same({ #uniq }, vt.stride_per_key_per_rank[ki], "stride of key " .. ki)
        for b = 1, ref.stride do
          assert.equal(inv[b], vt.inverse_indices[(ki - 1) * ref.stride + b])
        end
        for u = 1, #uniq do assert.equal(#uniq[u].ids, vt.lengths[bag0 + u]) end
        bag0 = bag0 + #uniq
      end
      assert.is_true(v:validate())
      same(ref, v:expand(), "expand " .. trial)

      -- expand rows: a per-bag output back to the full batch's bag order
      local nb = bag0
      local out = ur.tensor({ math.max(nb, 0), 2 }, { dtype = "f32" })
      for i = 0, nb * 2 - 1 do out[i] = i end
      local full = v:expand(out)
      assert.same({ #ref.keys * ref.stride, 2 }, full:size())
      local ft = full:totable()
      local kb = 0
      for ki = 1, #ref.keys do
        for b = 1, ref.stride do
          local src = kb + vt.inverse_indices[(ki - 1) * ref.stride + b]
          local row = (ki - 1) * ref.stride + b - 1
          assert.same({ src * 2, src * 2 + 1 }, { ft[row * 2 + 1], ft[row * 2 + 2] })
        end
        kb = kb + vt.stride_per_key_per_rank[ki][1]
      end

      -- placements
      for _, place in ipairs(h.placements()) do
        local moved = assert(k:to(place))
        assert.equal(place, moved:placement())
        same(ref, moved, "to " .. place .. " " .. trial)
        same(ref, moved:to("host"), "back from " .. place)
      end
    end
  end)

  it("bucketizes keys by row blocks for row-wise sharding, against the reference", function()
    for t, shape in ipairs(shapes) do
      for weighted = 0, 1 do
        local rng = rng_of(500 + 10 * t + weighted)
        local ref = random_ref(rng, shape[1], shape[2], weighted == 1, 4)
        local kjt = make(ref)
        local buckets, blocks, expect = rng(4), {}, { keys = {}, stride = ref.stride, bags = {},
                                                      weighted = ref.weighted }
        for k, key in ipairs(ref.keys) do
          local block = k % 2 == 1 and rng(3) or nil -- every other key stays
          if block and block * buckets < 6 then block = math.ceil(6 / buckets) end
          if block then blocks[key] = { block = block, rows = 6 } end
          for b = 0, (block and buckets or 1) - 1 do
            expect.keys[#expect.keys + 1] = block and (key .. "@" .. b) or key
            local bags = {}
            for j = 1, ref.stride do
              local src, bag = ref.bags[k][j], { ids = {}, w = {} }
              for i = 1, #src.ids do
                if not block or math.floor(src.ids[i] / block) == b then
                  bag.ids[#bag.ids + 1] = block and src.ids[i] - b * block or src.ids[i]
                  bag.w[#bag.w + 1] = src.w[i]
                end
              end
              bags[j] = bag
            end
            expect.bags[#expect.keys] = bags
          end
        end
        same(expect, assert(kjt:bucketize(buckets, blocks)), "bucketize " .. t .. " " .. weighted)
      end
    end
    local k = ur.KJT { keys = { "a", "b" }, values = { 1, 9, 2 }, lengths = { 1, 1, 1, 0 } }
    assert.has_error(function() k:bucketize(2, { a = { block = 5, rows = 9 } }) end,
      "kjt bucketize: key 'a' sample 1 has id 9; expected 0..8 (its table's rows)")
    assert.has_error(function() k:bucketize(2, { a = { block = 4, rows = 9 } }) end,
      "kjt bucketize: key 'a' has blocks of 4 rows for a table of 9 rows; expected 2 blocks to cover it")
    assert.has_error(function() k:bucketize(2, { c = { block = 4, rows = 8 } }) end, "kjt bucketize: no key 'c'")
    assert.has_error(function() k:bucketize(0, {}) end, "kjt bucketize: 0 buckets; expected 1..4096")
    assert.has_error(function() k:dedup():bucketize(2, {}) end, "kjt bucketize: a VBE batch; expand() it first")
  end)

  it("keeps a VBE batch through permute, split and placement moves", function()
    local k = ur.KJT { keys = { "a", "b", "c" }, values = { 1, 1, 2, 3, 3, 3, 4, 5 },
                       lengths = { 1, 1, 1, 1, 1, 1, 1, 1, 0 } }
    local v = k:dedup()
    assert.same({ { 2 }, { 1 }, { 3 } }, v:stride_per_key_per_rank())
    local p = v:permute { "c", "a" }
    assert.same({ { 3 }, { 2 } }, p:stride_per_key_per_rank())
    assert.same({ 0, 1, 2, 0, 0, 1 }, p:inverse_indices():totable())
    assert.same(k:permute { "c", "a" }:totable(), p:expand():totable())
    local parts = v:split { 2, 1 }
    assert.same({ 1, 2, 3 }, parts[1]:values():totable())
    assert.same(k:split { 2, 1 }[2]:totable(), parts[2]:expand():totable())
    assert.same(k:totable(), ur.KJT.concat(parts):expand():totable())
    local m = v:to("managed")
    assert.same(v:totable(), m:totable())
    assert.has_error(function() v:dedup() end,
      "kjt dedup: the KJT already has a variable batch per key; expand() it first")
  end)

  it("builds a VBE batch from stride_per_key_per_rank and inverse_indices (TorchRec's names)", function()
    local v = ur.KJT { keys = { "a" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 2 } },
                       inverse_indices = { 0, 1, 1, 0 } }
    assert.equal(4, v:stride())
    assert.same({ 5, 6, 6, 5 }, v:expand():values():totable())
    assert.has_error(function()
      ur.KJT { keys = { "a" }, values = { 5 }, lengths = { 1 }, stride_per_key_per_rank = { 1 },
               inverse_indices = { 0 } }
    end, "kjt: stride_per_key_per_rank[1] must be a list of one stride (one rank), such as {2}")
    assert.has_error(function()
      ur.KJT { keys = { "a", "b" }, values = { 5 }, lengths = { 1 }, stride_per_key_per_rank = { { 1 } } }
    end, "kjt: stride_per_key_per_rank has 1 entry for 2 keys")
  end)

  it("copies into buffers kept by the caller: views of them, the same KJT", function()
    local v = ur.KJT { keys = { "a", "b" }, values = { 5, 6, 7 }, lengths = { 1, 0, 2, 0 }, weights = { 1, 2, 3 } }
    local into = { values = ur.tensor({ 8 }, { dtype = "i64" }), lengths = ur.tensor({ 8 }, { dtype = "i32" }),
                   offsets = ur.tensor({ 8 }, { dtype = "i64" }), weights = ur.tensor({ 8 }, { dtype = "f32" }) }
    local c = assert(v:copy(into))
    assert.same(v:totable(), c:totable())
    assert.equal(ur.C.ur_tensor_id(into.values.p), ur.C.ur_tensor_id(c:values().p))
    local d = v:dedup()
    assert.has_error(function() d:copy(into) end, "kjt copy: no buffer for its inverse_indices")
    into.values = ur.tensor({ 2 }, { dtype = "i64" })
    assert.has_error(function() v:copy(into) end,
      "kjt copy: the buffer for its values is i64 of 2 elements (1-D); expected 1-D i64 of at least 3")
  end)

  it("names the key and the position in every error", function()
    local KJT = ur.KJT
    -- two keys of one name: a lookup by name would read one key's bags for both
    assert.has_error(function() KJT { keys = { "a", "b", "a" }, values = { 1, 2, 3 }, lengths = { 1, 1, 1 } } end,
      "kjt: keys 0 and 2 are both named 'a'; expected distinct keys")
    assert.has_error(function() KJT { keys = { "a", "b" }, values = { 1, 2 }, lengths = { 1, -1, 1, 1 } } end,
      "kjt: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
    assert.has_error(function() KJT { keys = { "a", "C3" }, values = { 1, 2, 3 }, lengths = { 1, 0, 2, 2 } } end,
      "kjt: key 'C3' lengths sum to 4 for the 2 values left (the bag of sample 1, lengths[3], ends past them)")
    assert.has_error(function() KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 0, 1, 0 } } end,
      "kjt: lengths sum to 2 for 3 values (1 left after the last key, 'b')")
    assert.has_error(function() KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 1 } } end,
      "kjt: 3 lengths do not divide among 2 keys; give stride= or 2 lengths per key")
    assert.has_error(function()
      KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 1 }, stride = 2 }
    end,
      "kjt: 2 keys with stride 2 need 4 lengths, got 3")
    assert.has_error(function() KJT { keys = { "a" }, values = { 1, 2 }, lengths = { 2 }, weights = { 1 } } end,
      "kjt: 1 weight for 2 values; expected one per value")
    assert.has_error(function() KJT { keys = { "a", 3 }, values = {}, lengths = {} } end,
      "kjt: key 2 is number; expected a string")
    -- ids and lengths from Lua numbers are whole and fit their dtype; nothing is truncated
    assert.has_error(function() KJT { keys = { "a" }, values = { 7, 1.5 }, lengths = { 2 } } end,
      "kjt: values[2] is 1.5; expected a whole number that fits i64")
    assert.has_error(function() KJT { keys = { "a" }, values = { 0 / 0 }, lengths = { 1 } } end,
      "kjt: values[1] is nan; expected a whole number that fits i64")
    assert.has_error(function() KJT { keys = { "a" }, values = { 2 ^ 63 }, lengths = { 1 } } end,
      "kjt: values[1] is 9.2233720368548e+18; expected a whole number that fits i64")
    assert.has_error(function() KJT { keys = { "a" }, values = { 1, 2 }, lengths = { 1.5, 0.5 }, stride = 2 } end,
      "kjt: lengths[1] is 1.5; expected a whole number that fits i32")
    assert.has_error(function() KJT { keys = { "a" }, values = {}, lengths = { 2 ^ 32 } } end,
      "kjt: lengths[1] is 4294967296; expected a whole number that fits i32")
    -- so are the counts and sizes the ops take (1.5 read as 1 gave another KJT than asked for)
    assert.has_error(function() KJT { keys = { "a" }, values = { 1 }, lengths = { 1 }, stride = 1.5 } end,
      "kjt: stride is 1.5; expected a whole number that fits i64")
    assert.has_error(function() KJT { keys = { "a" }, values = { 1 }, lengths = { 1 }, stride = "1" } end,
      "kjt: stride is string; expected a number")
    assert.has_error(function()
      KJT { keys = { "a" }, values = { 5 }, lengths = { 1 }, stride_per_key_per_rank = { { 1.5 } },
            inverse_indices = { 0 } }
    end, "kjt: stride_per_key_per_rank[1][1] is 1.5; expected a whole number that fits i64")
    local two = KJT { keys = { "a", "b" }, values = { 1, 2 }, lengths = { 1, 1 } }
    assert.has_error(function() two:split { 1.7, 1 } end,
      "kjt split: sizes[1] is 1.7; expected a whole number that fits i32")
    assert.has_error(function() two:validate(1.5) end,
      "kjt validate: rows of key 'a' is 1.5; expected a whole number that fits i64")
    -- a misspelt key's rows were left unchecked: { a = 5, bb = 1 } checked a alone
    assert.has_error(function() two:validate { a = 5, bb = 1 } end,
      "kjt validate: rows names 'bb', which is neither a key of the KJT nor a position 1..2")
    assert.has_error(function() two:validate { 5, 1, 9 } end,
      "kjt validate: rows names 3, which is neither a key of the KJT nor a position 1..2")
    assert.is_true(two:validate { a = 5, b = 3 })
    assert.is_nil((two:validate { a = 5, [2] = 2 })) -- b's id 2 of 2 rows
    assert.has_error(function() two:bucketize(2, { b = { block = 1.5, rows = 3 } }) end,
      "kjt bucketize: key 'b' block is 1.5; expected a whole number that fits i64")
    assert.has_error(function()
      KJT.from_rows { keys = { "a", "b" }, hot = { 1.5, 1 }, ids = ur.tensor({ 1, 2 }, { dtype = "i64" }):fill(1) }
    end, "KJT.from_rows: hot[1] is 1.5; expected a whole number that fits i32")
    assert.has_error(function()
      KJT.from_rows { keys = { "a", "a" }, hot = { 1, 1 }, ids = ur.tensor({ 1, 2 }, { dtype = "i64" }):fill(1) }
    end, "kjt: keys 0 and 1 are both named 'a'; expected distinct keys")
    assert.equal(-2 ^ 63, KJT { keys = { "a" }, values = { -2 ^ 63 }, lengths = { 1 } }:values()[0])
    assert.has_error(function()
      KJT { keys = { "a" }, values = ur.tensor({ 1 }, { dtype = "i32" }), lengths = { 1 } }
    end, "kjt: values must be a 1-d i64 tensor, got i32 with 1 dimensions")
    assert.has_error(function()
      KJT { keys = { "a" }, values = { 5 }, lengths = { 1 }, stride_per_key_per_rank = { { 1 } },
            inverse_indices = { 1 } }
    end, "kjt: key 'a' sample 0 has inverse index 1; expected 0..0 (the key's stride is 1)")
    local k = KJT { keys = { "a", "C7" }, values = { 1, 2, 999, 3 }, lengths = { 1, 1, 2, 0 } }
    assert.is_true(k:validate { 10, 1000 })
    local ok, err = k:validate { a = 10, C7 = 100 }
    assert.is_nil(ok)
    assert.equal("kjt: key 'C7' sample 0 (values[2]) has id 999, outside the table's 100 rows", err)
    ok, err = KJT { keys = { "a" }, values = { -1 }, lengths = { 1 } }:validate { 5 }
    assert.equal("kjt: key 'a' sample 0 (values[0]) has id -1, outside the table's 5 rows", err)
    assert.is_nil(ok)
    assert.has_error(function() k:permute { "zz" } end, "kjt: no key 'zz'")
    assert.has_error(function() k:permute { 3 } end, "kjt: key 3 is neither a key name nor a position 1..2")
    assert.has_error(function() k:split { 1, 2 } end,
      "kjt split: segments hold 3 keys in all but the KJT has 2")
    assert.has_error(function() KJT { keys = { "a" }, values = { 1 }, lengths = { 1 }, weight = { 2 } } end,
      "KJT: unknown option 'weight'; expected check, inverse_indices, keys, lengths, stride, "
      .. "stride_per_key_per_rank, values, weights")
    assert.has_error(function() ur.KJT.concat { k, k } end, "kjt concat: key 'a' of part 2 is also in part 1")
    local other = KJT { keys = { "z" }, values = { 1 }, lengths = { 1 } }
    assert.has_error(function() k:concat(other) end, "kjt concat: part 2 has stride 1 but part 1 has 2")
    -- the devices too (two GPUs share a placement's name: kjt_cuda_spec)
    local pinned = KJT { keys = { "z" }, values = { 1, 2 }, lengths = { 1, 1 } }:to("pinned")
    assert.has_error(function() k:concat(pinned) end,
      "kjt concat: part 2 is in pinned (device -1) but part 1 in host (device -1); one placement for all")
    assert.has_error(function() k:expand(ur.tensor({ 3, 2 })) end,
      "kjt expand: the input has 3 rows but the KJT has 4 bags (one row per bag)")
    local freed = KJT { keys = { "a" }, values = {}, lengths = { 0 } }
    freed:free()
    freed:free()
    assert.has_error(function() freed:values() end, "kjt: used after free()")
  end)

  it("refuses to permute a KJT made unchecked whose lengths do not match its values", function()
    local KJT = ur.KJT
    local function unchecked(values, lengths)
      return KJT { keys = { "a", "b" }, values = values, lengths = lengths, check = false }
    end
    -- each copies one span of values per key: a span past the values was read out of bounds
    assert.has_error(function() unchecked({ 1, 2, 3 }, { 1, 1, 400, 1 }):permute { "b", "a" } end,
      "kjt permute: key 'b' lengths sum to 401 for the 1 value left (a KJT made unchecked? "
      .. "ur_kjt_validate names the bag)")
    assert.has_error(function() unchecked({ 1, 2, 3 }, { 1, -2, 1, 1 }):permute { "b" } end,
      "kjt permute: key 'a' lengths sum to -1; expected a count of values, 0 or more (a KJT made "
      .. "unchecked? ur_kjt_validate names the bag)")
    assert.has_error(function() unchecked({ 1, 2, 3, 4 }, { 1, 1, 1, 0 }):permute { "a" } end,
      "kjt permute: lengths sum to 3 for 4 values (1 left after the last key, 'b'; a KJT made "
      .. "unchecked? ur_kjt_validate names the bag)")
    -- bags of a key that are bad on their own, in spans that fit, are copied as they are
    local odd = unchecked({ 1, 2, 3 }, { 2, -1, 1, 1 }):permute { "b", "a" }
    assert.same({ 1, 1, 2, -1 }, odd:lengths():totable())
    assert.same({ 2, 3, 1 }, odd:values():totable())
  end)

  it("refuses to dedup, expand or bucketize a KJT made unchecked with bad bags, naming the op, key and sample",
    function()
    local KJT = ur.KJT
    local function unchecked(values, lengths)
      return KJT { keys = { "a", "b" }, values = values, lengths = lengths, check = false }
    end
    -- these read bag by bag through the offsets: a bag past the values was read out of bounds
    -- (garbage ids in the result, no error), a negative length copied as it was
    local over, neg = unchecked({ 1, 2, 3 }, { 1, 1, 400, 1 }), unchecked({ 1, 2, 3 }, { 2, -1, 1, 1 })
    assert.is_false(over:checked())
    assert.is_false(neg:checked())
    local calls = {
      dedup = function(k) return k:dedup() end,
      expand = function(k) return k:expand() end,
      bucketize = function(k) return k:bucketize(2, { a = { block = 2, rows = 4 }, b = { block = 2, rows = 4 } }) end,
    }
    for op, call in pairs(calls) do
      assert.has_error(function() call(over) end,
        "kjt " .. op .. ": key 'b' sample 0: offsets 2..402 disagree with length 400 or pass the 3 values")
      assert.has_error(function() call(neg) end,
        "kjt " .. op .. ": key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
    end
    -- a failed call loses nothing: the KJT is as it was, still not known checked
    assert.same({ 1, 1, 400, 1 }, over:lengths():totable())
    assert.is_false(over:checked())
    assert.equal("kjt: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0", select(2, neg:validate()))
    -- a VBE batch's inverse indices are read as bag numbers: one past its key's bags crashed
    local function vbe(inverse)
      return KJT { keys = { "a" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 2 } },
                   inverse_indices = inverse, check = false }
    end
    local bad = vbe { 0, 1000000, 1 }
    assert.is_false(bad:checked())
    local want = "kjt expand: key 'a' sample 1 has inverse index 1000000; expected 0..1 (the key's stride is 2)"
    assert.has_error(function() bad:expand() end, want)
    assert.has_error(function() bad:expand(ur.tensor({ 2, 3 }):fill(1)) end, want)
    -- sound ones made unchecked are known checked as made: the make's pass reads inverse indices too
    local good = vbe { 0, 1, 1 }
    assert.is_true(good:checked())
    assert.same({ 5, 6, 6 }, good:expand():values():totable())
    assert.is_true(good:checked())
    assert.same({ 1, 2, 2 }, good:expand(tensor_of({ 1, 2 }, "f32")):totable())
  end)

  it("refuses to split or concat KJTs made unchecked whose key spans do not fit their values", function()
    local KJT = ur.KJT
    local function unchecked(keys, values, lengths)
      return KJT { keys = keys, values = values, lengths = lengths, check = false }
    end
    -- split's parts are views of key spans: a span past the values failed as a tensor's view
    assert.has_error(function() unchecked({ "a", "b" }, { 1, 2, 3 }, { 1, 1, 400, 1 }):split { 1, 1 } end,
      "kjt split: key 'b' lengths sum to 401 for the 1 value left (a KJT made unchecked? ur_kjt_validate "
      .. "names the bag)")
    assert.has_error(function() unchecked({ "a", "b" }, { 1, 2, 3 }, { 1, -2, 1, 1 }):split { 1, 1 } end,
      "kjt split: key 'a' lengths sum to -1; expected a count of values, 0 or more (a KJT made unchecked? "
      .. "ur_kjt_validate names the bag)")
    -- concat lays each part's key spans after the values of the parts before: a part whose
    -- lengths say 5 of its 3 values, before one whose lengths say 1 of its 3, gave key 'a' the
    -- next part's values 7 and 8, silently (the result even passed validate(): 6 values, 6 long)
    local p1 = unchecked({ "a" }, { 1, 2, 3 }, { 4, 1 })
    local p2 = unchecked({ "b" }, { 7, 8, 9 }, { 0, 1 })
    local sound = unchecked({ "c" }, { 4 }, { 0, 1 })
    assert.has_error(function() KJT.concat { p1, p2 } end,
      "kjt concat: part 1: key 'a' lengths sum to 5 for the 3 values left (a KJT made unchecked? "
      .. "ur_kjt_validate names the bag)")
    assert.has_error(function() KJT.concat { sound, p2, p1 } end,
      "kjt concat: part 2: lengths sum to 1 for 3 values (2 left after the last key, 'b'; a KJT made "
      .. "unchecked? ur_kjt_validate names the bag)")
    -- spans that fit with a bag bad within: made, not known checked, refused by the next reader
    local odd = KJT.concat { unchecked({ "a" }, { 1, 2, 3 }, { 4, -1 }), sound }
    assert.is_false(odd:checked())
    assert.is_false(unchecked({ "a", "b" }, { 1, 2, 3 }, { 2, -1, 1, 1 }):split { 1, 1 }[1]:checked())
    assert.has_error(function() odd:dedup() end,
      "kjt dedup: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
  end)

  it("refuses offsets written as any 64-bit integers, at the ends of the range too, without overflowing", function()
    -- a bag's offsets were subtracted before they were held to the values: INT64_MAX - -16 overflowed (undefined;
    -- UBSan stopped `make SAN=1 test` here, and engine/fuzz/kjt_arrays.c found it), on the CPU and in the kernel
    local ffi = require "ffi"
    local function written(offsets)
      local k = ur.KJT { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }
      local o = ffi.cast("int64_t *", ur.C.ur_tensor_data(k:offsets().p))
      for i, x in ipairs(offsets) do o[i - 1] = x end
      return k
    end
    local max, min = 0x7fffffffffffffffLL, -0x7fffffffffffffffLL - 1
    assert.equal("kjt: key 'a' sample 0: offsets -16..9223372036854775807 disagree with length 1 or pass the 3 values",
                 select(2, written({ -16, max, 2, 3, 3 }):validate()))
    assert.equal("kjt: key 'a' sample 1: offsets 1..-9223372036854775808 disagree with length 1 or pass the 3 values",
                 select(2, written({ 0, 1, min, 3, 3 }):validate()))
    assert.has_error(function() written({ 0, max, min, max, 3 }):dedup() end,
      "kjt dedup: key 'a' sample 0: offsets 0..9223372036854775807 disagree with length 1 or pass the 3 values")
  end)

  it("knows a KJT checked when made, validated or made by an op from checked KJTs, and checks none again",
    function()
    local KJT = ur.KJT
    local k = KJT { keys = { "a", "b" }, values = { 3, 1, 3, 0, 2 }, lengths = { 1, 1, 2, 1 } }
    assert.is_true(k:checked())
    -- made unchecked but sound: the offsets' scan saw it (no pass of its own)
    assert.is_true(KJT { keys = { "a", "b" }, values = { 3, 1, 3, 0, 2 }, lengths = { 1, 1, 2, 1 },
                         check = false }:checked())
    -- the results of every op of a checked KJT are checked: nothing is checked twice
    local v = k:dedup()
    local ids = ur.tensor({ 2, 3 }, { dtype = "i64" }):fill(1)
    local results = {
      permute = k:permute { "b", "a", "b" }, split = k:split { 1, 1 }[2],
      concat = KJT.concat { k:split { 1, 1 }[2], KJT { keys = { "z" }, values = { 9 }, lengths = { 0, 1 } } },
      dedup = v, expand = v:expand(), split_vbe = v:split { 1, 1 }[2], permute_vbe = v:permute { "b" },
      bucketize = k:bucketize(2, { a = { block = 2, rows = 4 } }), to = k:to("pinned"),
      copy = k:copy { values = ur.tensor({ 5 }, { dtype = "i64" }), lengths = ur.tensor({ 4 }, { dtype = "i32" }),
                      offsets = ur.tensor({ 5 }, { dtype = "i64" }) },
      from_rows = KJT.from_rows { keys = { "x", "y" }, hot = { 1, 2 }, ids = ids,
                                  lengths = ur.tensor({ 2, 2 }, { dtype = "i32" }):fill(1) },
    }
    for op, r in pairs(results) do assert.is_true(r:checked(), op) end
    -- the loader writes its batches' lengths, offsets and key spans together: checked, unscanned
    local loader = h.tiny_loader(8, 4)
    for b in loader:batches() do assert.is_true(b.sparse:checked(), "loader") end
    loader:close()
    -- a VBE batch made unchecked: known checked when its inverse indices are sound too (the make
    -- reads them after the lengths' scan: managed collisions' rows, the sharded exchange's batch)
    local function vbe(inverse)
      return KJT { keys = { "a" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 2 } },
                   inverse_indices = inverse, check = false }
    end
    assert.is_true(vbe({ 0, 1, 1 }):checked())
    -- one past its key's bags: not known checked (nor its results) until written right and validated
    local u = vbe { 0, 2, 1 }
    assert.is_false(u:checked())
    assert.is_false(u:permute { "a" }:checked())
    assert.is_false(u:to("pinned"):checked())
    u:inverse_indices():set(1, 1)
    assert.is_true(u:validate())
    assert.is_true(u:checked())
    assert.is_true(u:permute { "a" }:checked())
    -- the mark holds for the contents checked: written into after, validate() says so and unmarks
    local lengths = tensor_of({ 1, 1, 2, 1 }, "i32")
    local w = KJT { keys = { "a", "b" }, values = { 3, 1, 3, 0, 2 }, lengths = lengths }
    assert.is_true(w:checked())
    lengths[2] = -1
    assert.equal("kjt: key 'b' sample 0 (lengths[2]) has length -1; lengths must be >= 0", select(2, w:validate()))
    assert.is_false(w:checked())
    assert.has_error(function() w:dedup() end,
      "kjt dedup: key 'b' sample 0 (lengths[2]) has length -1; lengths must be >= 0")
    -- tensors rewritten bag by bag sound, but not where the key spans kept since the KJT was made
    -- say: a copy into buffers the caller then reused for another batch.  validate() said true,
    -- and the ops trusting the spans read another key's ids (a split's part views 0 values and
    -- its offsets 0..2: expand read 2 ids past it); the offsets rewritten behind a KJT made
    -- unchecked with lengths {5, -5, 2} passed too, and permute wrote 5 values at -3
    local into = { values = ur.tensor({ 2 }, { dtype = "i64" }), lengths = ur.tensor({ 2 }, { dtype = "i32" }),
                   offsets = ur.tensor({ 3 }, { dtype = "i64" }) }
    local c = assert(KJT { keys = { "a", "b" }, values = { 7, 8 }, lengths = { 2, 0 } }:copy(into))
    assert(KJT { keys = { "a", "b" }, values = { 5, 6 }, lengths = { 0, 2 } }:copy(into))
    assert.equal("kjt: key 'b' starts at value 2 by the lengths the KJT was made with, but its offsets say 0 (its "
      .. "tensors written since? make a new KJT of them)", select(2, c:validate()))
    assert.is_false(c:checked())
    assert.has_error(function() c:dedup() end, "kjt dedup: key 'b' starts at value 2 by the lengths the KJT was made "
      .. "with, but its offsets say 0 (its tensors written since? make a new KJT of them)")
    local bad = KJT { keys = { "a", "b", "c" }, values = { 1, 2 }, lengths = { 5, -5, 2 }, check = false }
    local o, l = bad:offsets(), bad:lengths()
    for i, x in ipairs { 0, 1, 1, 2 } do o:set(i - 1, x) end
    for i, x in ipairs { 1, 0, 1 } do l:set(i - 1, x) end
    assert.equal("kjt: key 'b' starts at value 5 by the lengths the KJT was made with, but its offsets say 1 (its "
      .. "tensors written since? make a new KJT of them)", select(2, bad:validate()))
    assert.has_error(function() bad:permute { 3, 2, 1 } end)
  end)

  it("lays sample-major rows out key-major (from_rows), as the plain loops would", function()
    local rng = rng_of(31)
    local hot, n = { 1, 3, 2, 4 }, 37
    local H = 10
    for _, with_lengths in ipairs { true, false } do
      local ids, lens, w = {}, {}, {}
      for _ = 1, n do
        for _, k in ipairs(hot) do
          local m = with_lengths and rng(k + 1) - 1 or k
          lens[#lens + 1] = m
          for q = 1, k do
            ids[#ids + 1] = q <= m and rng(1000) - 1 or -1
            w[#w + 1] = q <= m and rng(8) / 8 or 0
          end
        end
      end
      local function t2(list, dtype, cols) -- a [n, cols] tensor of a list
        local x = ur.tensor({ n, cols }, { dtype = dtype })
        for i, v in ipairs(list) do x:set(i - 1, v) end
        return x
      end
      local k = assert(ur.KJT.from_rows { keys = { "a", "b", "c", "d" }, hot = hot, ids = t2(ids, "i64", H),
                                       weights = t2(w, "f32", H),
                                       lengths = with_lengths and t2(lens, "i32", #hot) or nil })
      local want = { values = {}, lengths = {}, weights = {}, offsets = { 0 } }
      for t = 1, #hot do
        local c0 = 0
        for u = 1, t - 1 do c0 = c0 + hot[u] end
        for i = 1, n do
          local m = lens[(i - 1) * #hot + t]
          want.lengths[#want.lengths + 1] = m
          for q = 1, m do
            want.values[#want.values + 1] = ids[(i - 1) * H + c0 + q]
            want.weights[#want.weights + 1] = w[(i - 1) * H + c0 + q]
          end
          want.offsets[#want.offsets + 1] = #want.values
        end
      end
      local got = k:totable()
      assert.same(want.values, got.values)
      assert.same(want.lengths, got.lengths)
      assert.same(want.offsets, got.offsets)
      assert.same(want.weights, got.weights)
      assert.equal(n, k:stride())
    end
    local ids = ur.tensor({ 2, 3 }, { dtype = "i64" }):fill(0)
    local bad = ur.tensor({ 2, 2 }, { dtype = "i32" }):fill(0)
    bad:set(3, 3) -- lengths [2, 2]: sample 1's bag of key y (2 ids a sample) says 3
    assert.has_error(function()
      assert(ur.KJT.from_rows { keys = { "x", "y" }, hot = { 1, 2 }, ids = ids, lengths = bad })
    end,
      "kjt from_rows: key 'y' sample 1 has length 3; expected 0..2 (its ids a sample)")
    assert.has_error(function() assert(ur.KJT.from_rows { keys = { "x", "y" }, hot = { 1, 1 }, ids = ids }) end,
      "kjt from_rows: ids must be i64 [2, 2]; got i64 with 6 elements")
    -- an option misspelt was dropped: weight = w made an unweighted KJT
    local w = ur.tensor({ 2, 3 }):fill(0.5)
    assert.has_error(function() ur.KJT.from_rows { keys = { "x", "y" }, hot = { 1, 2 }, ids = ids, weight = w } end,
      "KJT.from_rows: unknown option 'weight'; expected hot, ids, keys, lengths, stream, weights")
    local pinned = ur.tensor({ 2, 3 }, { placement = "pinned" }):fill(1)
    assert.has_error(function()
      assert(ur.KJT.from_rows { keys = { "x", "y" }, hot = { 1, 2 }, ids = ids, weights = pinned })
    end, "kjt from_rows: weights is in pinned (device -1) but ids in host (device -1); one placement for all")
  end)

  h.cuda_it("gives the same results on the GPU as on the CPU", function()
    for trial = 1, 10 do
      local rng = rng_of(100 + trial)
      local ref = random_ref(rng, 4, 6, trial % 2 == 1, 4)
      local k = make(ref)
      local g = assert(k:to("device"))
      assert.equal("device", g:placement())
      same(ref, g, "device")
      assert.same(k:permute { 3, 1 }:totable(), g:permute { 3, 1 }:totable())
      assert.same(k:dedup():totable(), g:dedup():totable())
      assert.same(k:dedup():expand():totable(), g:dedup():expand():totable())
      assert.same(k:split { 1, 3 }[2]:totable(), g:split { 1, 3 }[2]:totable())
      assert.is_true(g:validate { 6, 6, 6, 6 })
      assert.equal("device", g:dedup():placement())
    end
  end)
end)
