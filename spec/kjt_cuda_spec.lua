-- Keyed jagged tensors on the GPU against the CPU (the reference, itself checked against plain
-- Lua in kjt_spec.lua): every operation on device and managed KJTs, on random jagged inputs
-- (empty bags, keys with no values, batch of one, weights, variable batch per key), and every
-- validation error with the CPU's message.  Every test is #cuda: pending without a GPU.
local ur = require "uvmrec"
local h = require "helpers"
local cuda_it = h.cuda_it

local gpu_places = { "device", "managed" }

local rng_of = h.rng

-- Lists for a random KJT: ids drawn from `ids` values so dedup finds repeats; every fifth key
-- empty; weights from four values, so equal ids with other weights are other bags.
local function random_lists(rng, nkeys, stride, maxlen, ids, weighted)
  local o = { keys = {}, values = {}, lengths = {}, weights = weighted and {} or nil, stride = stride,
              ids_max = ids }
  for k = 1, nkeys do
    o.keys[k] = "f" .. k .. "_" .. rng(1000)
    local empty = rng(5) == 1
    for _ = 1, stride do
      local n = empty and 0 or rng(maxlen + 1) - 1
      o.lengths[#o.lengths + 1] = n
      for _ = 1, n do
        o.values[#o.values + 1] = rng(ids) - 1
        if weighted then o.weights[#o.weights + 1] = rng(4) / 4 end
      end
    end
  end
  return o
end

-- Small and degenerate shapes, then sizes past one block of the kernels and cub's tiles.
local shapes = {
  { 3, 4, 3, 6 }, { 1, 1, 2, 3 }, { 5, 1, 3, 2 }, { 2, 7, 4, 5 }, { 4, 0, 3, 6 }, { 0, 3, 3, 6 },
  { 26, 64, 3, 40 }, { 3, 3000, 6, 12 }, { 2, 20000, 4, 300 },
}

local function trials()
  local out = {}
  for i, s in ipairs(shapes) do
    for weighted = 0, 1 do
      local rng = rng_of(1000 * i + weighted)
      out[#out + 1] = random_lists(rng, s[1], s[2], s[3], s[4], weighted == 1)
    end
  end
  return out
end

-- The KJT of o's fields on the host (random_lists' ids_max is the spec's, not an option of a KJT)
local function make(o)
  return assert(ur.KJT { keys = o.keys, values = o.values, lengths = o.lengths, weights = o.weights,
                         stride = o.stride, stride_per_key_per_rank = o.stride_per_key_per_rank,
                         inverse_indices = o.inverse_indices })
end

-- A tensor of the list in a placement.
local function tensor_of(list, dtype, place)
  local t = ur.tensor({ #list }, { dtype = dtype })
  for i, x in ipairs(list) do t[i - 1] = x end
  return place == "host" and t or assert(t:to(place))
end

-- The KJT built from tensors already in place (so the GPU computes the offsets and checks).
local function make_in(o, place)
  return ur.KJT { keys = o.keys, stride = o.stride, values = tensor_of(o.values, "i64", place),
                  lengths = tensor_of(o.lengths, "i32", place),
                  weights = o.weights and tensor_of(o.weights, "f32", place),
                  stride_per_key_per_rank = o.stride_per_key_per_rank,
                  inverse_indices = o.inverse_indices and tensor_of(o.inverse_indices, "i64", place),
                  check = o.check }
end

local function same(cpu, gpu, place, what)
  assert.equal(place, gpu:placement(), what)
  assert.same(cpu:totable(), gpu:totable(), what)
  for i = 1, cpu:num_keys() do assert.same(cpu:key_span(i), gpu:key_span(i), what) end
end

describe("uvmrec.KJT on the GPU", function()
  cuda_it("builds offsets and key spans from lengths in device and managed memory", function()
    for t, o in ipairs(trials()) do
      local cpu = make(o)
      for _, place in ipairs(gpu_places) do
        local g = assert(make_in(o, place))
        same(cpu, g, place, "construct " .. t .. " " .. place)
        assert.is_true(g:validate())
        same(cpu, assert(g:to("host")), "host", "back " .. t)
      end
    end
  end)

  cuda_it("permutes (subsets, repeats), splits, concatenates and makes dicts like the CPU", function()
    for t, o in ipairs(trials()) do
      local rng = rng_of(7 + t)
      local cpu = make(o)
      local nk = #o.keys
      for _, place in ipairs(gpu_places) do
        local g = assert(cpu:to(place))
        local what = t .. " " .. place
        if nk > 0 then
          local order = {}
          for j = 1, nk + 2 do order[j] = rng(nk) end -- repeats, and some keys left out
          same(cpu:permute(order), assert(g:permute(order)), place, "permute " .. what)
          same(cpu:permute { nk }, assert(g:permute { nk }), place, "permute last " .. what)
        end
        same(cpu:permute {}, assert(g:permute {}), place, "permute none " .. what)
        local sizes = h.random_sizes(rng, nk)
        local cparts, gparts = cpu:split(sizes), assert(g:split(sizes))
        for i = 1, #sizes do same(cparts[i], gparts[i], place, "split " .. what .. " part " .. i) end
        same(cpu, assert(ur.KJT.concat(gparts)), place, "concat " .. what)
        if nk > 1 then
          local back = { gparts[#gparts] }
          for i = 1, #gparts - 1 do back[#back + 1] = gparts[i] end
          same(ur.KJT.concat { cparts[#cparts], unpack(cparts, 1, #cparts - 1) },
            assert(ur.KJT.concat(back)), place, "concat reordered " .. what)
        end
        local cd, gd = cpu:to_dict(), g:to_dict()
        for _, key in ipairs(o.keys) do
          for _, part in ipairs { "values", "lengths", "offsets" } do
            assert.same(cd[key][part]:totable(), gd[key][part]:totable(), part .. " " .. key .. " " .. what)
          end
          assert.same(cd[key].weights and cd[key].weights:totable(),
            gd[key].weights and gd[key].weights:totable(), "weights " .. key .. " " .. what)
        end
      end
    end
  end)

  cuda_it("bucketizes keys by row blocks like the CPU, and names a bad id as it does", function()
    for t, o in ipairs(trials()) do
      local cpu = make(o)
      local blocks = {}
      for k, key in ipairs(o.keys) do
        if k % 2 == 1 then blocks[key] = { block = math.ceil(o.ids_max / 3), rows = o.ids_max } end
      end
      local want = assert(cpu:bucketize(3, blocks))
      for _, place in ipairs(gpu_places) do
        same(want, assert(assert(cpu:to(place)):bucketize(3, blocks)), place, "bucketize " .. t .. " " .. place)
      end
    end
    local k = ur.KJT { keys = { "a" }, values = { 1, 9 }, lengths = { 1, 1 } }
    local g = assert(k:to("device"))
    local ok1, e1 = pcall(k.bucketize, k, 2, { a = { block = 5, rows = 9 } })
    local ok2, e2 = pcall(g.bucketize, g, 2, { a = { block = 5, rows = 9 } })
    assert.is_false(ok1 or ok2)
    assert.equal(tostring(e1):gsub("^.-: ", ""), tostring(e2):gsub("^.-: ", ""))
  end)

  cuda_it("deduplicates per key in order of first appearance and expands back like the CPU", function()
    for t, o in ipairs(trials()) do
      local cpu = make(o)
      local cv = cpu:dedup()
      for _, place in ipairs(gpu_places) do
        local what = t .. " " .. place
        local g = assert(cpu:to(place))
        local gv = assert(g:dedup())
        same(cv, gv, place, "dedup " .. what)
        assert.is_true(gv:validate())
        same(cpu, assert(gv:expand()), place, "expand " .. what)
        same(cpu, assert(g:expand()), place, "expand plain " .. what)
        -- VBE batches through permute, split, concat and moves
        local nk = #o.keys
        if nk > 0 then
          local order = { nk, 1, nk }
          same(cv:permute(order), assert(gv:permute(order)), place, "vbe permute " .. what)
          same(cpu:permute(order), assert(gv:permute(order):expand()), place, "vbe permute expand " .. what)
          local sizes = { math.floor(nk / 2), nk - math.floor(nk / 2) }
          local cp, gp = cv:split(sizes), assert(gv:split(sizes))
          for i = 1, 2 do same(cp[i], gp[i], place, "vbe split " .. i .. " " .. what) end
          same(cv, assert(ur.KJT.concat(gp)), place, "vbe concat " .. what)
          same(cv, assert(assert(gv:to("host")):to(place)), place, "vbe moves " .. what)
        end
        assert.has_error(function() gv:dedup() end,
          "kjt dedup: the KJT already has a variable batch per key; expand() it first")
      end
    end
  end)

  cuda_it("expands per-bag rows to the full batch (f32, odd-width bf16, i64; on a stream)", function()
    local s = assert(ur.stream())
    for t, o in ipairs(trials()) do
      local cv = make(o):dedup()
      local nb = #cv:lengths():totable()
      for _, spec in ipairs { { "f32", 3 }, { "bf16", 3 }, { "i64", 1 } } do
        local host = ur.tensor({ nb, spec[2] }, { dtype = spec[1] })
        for i = 0, nb * spec[2] - 1 do host[i] = (i * 7) % 97 end
        local want = cv:expand(host):totable()
        for _, place in ipairs(gpu_places) do
          local what = t .. " " .. spec[1] .. " " .. place
          local rows = assert(host:to(place))
          local gv = assert(cv:to(place))
          local got = assert(gv:expand(rows, s))
          s:sync()
          assert.equal(place, got:placement(), what)
          assert.same(want, got:totable(), what)
          -- a KJT left on the host, its per-bag output on the GPU
          assert.same(want, assert(cv:expand(rows)):totable(), "host kjt " .. what)
          -- and the other way round: the GPU's KJT, rows on the host
          assert.same(want, assert(gv:expand(host)):totable(), "host rows " .. what)
        end
      end
    end
  end)

  cuda_it("builds a VBE batch from stride_per_key_per_rank and inverse indices in place", function()
    local o = { keys = { "a", "b" }, values = { 5, 6, 7 }, lengths = { 1, 1, 1 },
                stride_per_key_per_rank = { { 2 }, { 1 } },
                inverse_indices = { 0, 1, 1, 0, 0, 0, 0, 0 } }
    local cpu = make(o)
    for _, place in ipairs(gpu_places) do
      local g = assert(make_in(o, place))
      same(cpu, g, place, "vbe " .. place)
      same(cpu:expand(), assert(g:expand()), place, "vbe expand " .. place)
    end
  end)

  -- What building (and validating) gives: true, or the error message without its position.
  local function outcome(o, place, rows)
    local ok, k, err = pcall(make_in, o, place)
    if not ok then return (tostring(k):gsub("^.-:%d+: ", "", 1)) end
    if not k then return err end
    local fine, msg = k:validate(rows)
    return fine or msg
  end

  -- Each error on the GPU, with the message the CPU gives for the same KJT.
  local function same_error(o, rows, want)
    local cmsg = outcome(o, "host", rows)
    assert.equal(want, cmsg)
    for _, place in ipairs(gpu_places) do assert.equal(cmsg, outcome(o, place, rows), place) end
  end

  cuda_it("names the key and the position of every error exactly as the CPU does", function()
    -- at construction
    same_error({ keys = { "a", "b" }, values = { 1, 2 }, lengths = { 1, -1, 1, 1 } }, nil,
      "kjt: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
    same_error({ keys = { "a", "C3" }, values = { 1, 2, 3 }, lengths = { 1, 0, 2, 2 } }, nil,
      "kjt: key 'C3' lengths sum to 4 for the 2 values left (the bag of sample 1, lengths[3], ends past them)")
    same_error({ keys = { "a", "C3" }, values = { 1, 2, 3 }, lengths = { 1, 0, 0, 3, -1, 4 }, stride = 3 }, nil,
      "kjt: key 'C3' lengths sum to 7 for the 2 values left (the bag of sample 0, lengths[3], ends past them)")
    same_error({ keys = { "a", "C3" }, values = { 1, 2, 3 }, lengths = { 1, 0, 0, 1, -2, 4 }, stride = 3 }, nil,
      "kjt: key 'C3' sample 1 (lengths[4]) has length -2; lengths must be >= 0")
    same_error({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 0, 1, 0 } }, nil,
      "kjt: lengths sum to 2 for 3 values (1 left after the last key, 'b')")
    same_error({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 1 }, stride = 2 }, nil,
      "kjt: 2 keys with stride 2 need 4 lengths, got 3")
    same_error({ keys = { "a" }, values = { 1, 2 }, lengths = { 2 }, weights = { 1 } }, nil,
      "kjt: 1 weight for 2 values; expected one per value")
    same_error({ keys = {}, values = { 1 }, lengths = {} }, nil, "kjt: no keys for 1 value")
    same_error({ keys = { "a" }, values = { 5 }, lengths = { 1 }, stride_per_key_per_rank = { { 1 } },
                 inverse_indices = { 1 } },
      nil, "kjt: key 'a' sample 0 has inverse index 1; expected 0..0 (the key's stride is 1)")
    same_error({ keys = { "a", "b" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 1 }, { 1 } },
                 inverse_indices = { 0, 0, 0, -1 } }, nil,
      "kjt: key 'b' sample 1 has inverse index -1; expected 0..0 (the key's stride is 1)")
    -- by validate: ids out of range (rows per key), negative ids
    local k = { keys = { "a", "C7" }, values = { 1, 2, 999, 3 }, lengths = { 1, 1, 2, 0 } }
    same_error(k, { 10, 100 }, "kjt: key 'C7' sample 0 (values[2]) has id 999, outside the table's 100 rows")
    same_error({ keys = { "a" }, values = { -1 }, lengths = { 1 } }, { 5 },
      "kjt: key 'a' sample 0 (values[0]) has id -1, outside the table's 5 rows")
    same_error({ keys = { "a", "b" }, values = { 0, 1, 7, 2, 9, 9 }, lengths = { 2, 1, 1, 2 } }, { 3, 9 },
      "kjt: key 'a' sample 1 (values[2]) has id 7, outside the table's 3 rows")
    for _, place in ipairs(gpu_places) do
      assert.is_true(assert(make_in(k, place)):validate { 10, 1000 })
      assert.is_true(assert(make_in(k, place)):validate { 0, 0 }) -- 0: no range given
    end
    -- unchecked KJTs: bad lengths and sums found by validate, the lowest key's error first
    same_error({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, -1, 1 }, check = false }, nil,
      "kjt: key 'b' sample 0 (lengths[2]) has length -1; lengths must be >= 0")
    same_error({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 2, 1 }, check = false }, nil,
      "kjt: key 'b' sample 0: offsets 2..4 disagree with length 2 or pass the 3 values")
    same_error({ keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 0, 0 }, check = false }, nil,
      "kjt: lengths sum to 2 for 3 values")
    -- an id error in key a comes before a length error in key b ...
    same_error({ keys = { "a", "b" }, values = { 50, 2, 3 }, lengths = { 1, 1, -1, 1 }, check = false }, { 10, 10 },
      "kjt: key 'a' sample 0 (values[0]) has id 50, outside the table's 10 rows")
    -- ... but within a key every bag is checked before the ids
    same_error({ keys = { "a", "b" }, values = { 50, 2, 3 }, lengths = { 1, -1, 1, 1 }, check = false }, { 10, 10 },
      "kjt: key 'a' sample 1 (lengths[1]) has length -1; lengths must be >= 0")
    -- ids before inverse indices of the same key, and key order across them
    local v = { keys = { "a", "b" }, values = { 5, 60 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 1 }, { 1 } },
                inverse_indices = { 0, 0, 0, 3 }, check = false }
    same_error(v, { 100, 10 }, "kjt: key 'b' sample 0 (values[1]) has id 60, outside the table's 10 rows")
    same_error(v, { 100, 100 }, "kjt: key 'b' sample 1 has inverse index 3; expected 0..0 (the key's stride is 1)")
  end)

  cuda_it("checks a KJT made unchecked before reading its bags, as the CPU does, and keeps the mark", function()
    -- "ok" or the error (less the caller's line it points at): the same on the GPU as on the CPU
    local function outcome_of(f, k)
      local ok, err = pcall(f, k)
      return ok and "ok" or (tostring(err):gsub("^[^:]*:%d+: ", ""))
    end
    local blocks = { a = { block = 2, rows = 4 }, b = { block = 2, rows = 4 } }
    local ops = {
      dedup = function(k) return k:dedup() end,
      expand = function(k) return k:expand() end,
      bucketize = function(k) return k:bucketize(2, blocks) end,
      split = function(k) return k:split { 1, 1 } end,
      permute = function(k) return k:permute { "b", "a" } end,
    }
    local vbe_ops = {
      expand = function(k) return k:expand() end,
      expand_rows = function(k)
        return k:expand(assert(ur.tensor({ 2, 3 }):fill(1):to(k:placement())))
      end,
    }
    local cases = {
      { o = { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 1, 1, 400, 1 }, check = false }, ops = ops },
      { o = { keys = { "a", "b" }, values = { 1, 2, 3 }, lengths = { 2, -1, 1, 1 }, check = false }, ops = ops },
      { o = { keys = { "a" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 2 } },
              inverse_indices = { 0, 1000000, 1 }, check = false }, ops = vbe_ops },
    }
    for i, c in ipairs(cases) do
      local cpu = assert(make_in(c.o, "host"))
      assert.is_false(cpu:checked())
      for name, f in pairs(c.ops) do
        local want = outcome_of(f, cpu)
        if name ~= "split" and name ~= "permute" or i == 1 then assert.are_not.equal("ok", want, name) end
        for _, place in ipairs(gpu_places) do
          local g = assert(make_in(c.o, place))
          assert.is_false(g:checked())
          assert.equal(want, outcome_of(f, g), name .. " " .. i .. " " .. place)
          assert.is_false(g:checked())
        end
      end
    end
    -- concat names the part whose key spans do not add up to its values
    local p1 = { keys = { "a" }, values = { 1, 2, 3 }, lengths = { 4, 1 }, check = false }
    local p2 = { keys = { "b" }, values = { 7, 8, 9 }, lengths = { 0, 1 }, check = false }
    local function cat(parts) return ur.KJT.concat(parts) end
    local want = outcome_of(cat, { assert(make_in(p1, "host")), assert(make_in(p2, "host")) })
    assert.are_not.equal("ok", want)
    for _, place in ipairs(gpu_places) do
      assert.equal(want, outcome_of(cat, { assert(make_in(p1, place)), assert(make_in(p2, place)) }), place)
    end
    -- the mark: made in place with the checks, by the GPU's scan, carried by to() and every op
    local good = { keys = { "a", "b" }, values = { 3, 1, 3, 0, 2 }, lengths = { 1, 1, 2, 1 }, check = false }
    local sound_vbe = { keys = { "a" }, values = { 5, 6 }, lengths = { 1, 1 }, stride_per_key_per_rank = { { 2 } },
                        inverse_indices = { 0, 1, 1 }, check = false }
    for _, place in ipairs(gpu_places) do
      local g = assert(make_in(good, place))
      assert.is_true(g:checked(), place)
      assert.is_true(assert(make(good)):to(place):checked(), place)
      local v = assert(g:dedup())
      for name, r in pairs { dedup = v, expand = assert(v:expand()), permute = assert(g:permute { "b" }),
                             split = assert(g:split { 1, 1 })[2], bucketize = assert(g:bucketize(2, blocks)),
                             concat = assert(ur.KJT.concat(assert(g:split { 1, 1 }))) } do
        assert.is_true(r:checked(), name .. " " .. place)
      end
      -- a sound VBE batch made unchecked: its inverse indices read by the make's pass on the GPU too
      local u = assert(make_in(sound_vbe, place))
      assert.is_true(u:checked())
      assert.same({ 5, 6, 6 }, assert(u:expand()):values():totable())
    end
  end)

  cuda_it("lays the generator's rows out key-major (from_rows) like the CPU, with and without lengths", function()
    local spec = ur.data.synthetic_spec {
      num_dense = 2, seed = 4,
      tables = { { rows = 100 }, { rows = 50, hot = { 0, 5 }, weighted = true }, { rows = 9, hot = 3 } } }
    local g = assert(ur.data.generate(spec, 0, 5000))
    local keys, hot = { "a", "b", "c" }, { 1, 5, 3 }
    local want = assert(ur.KJT.from_rows { keys = keys, hot = hot, ids = g.ids, weights = g.weights,
                                           lengths = g.lengths }):totable()
    for _, place in ipairs(gpu_places) do
      local got = assert(ur.KJT.from_rows { keys = keys, hot = hot, ids = assert(g.ids:to(place)),
                                            weights = assert(g.weights:to(place)),
                                            lengths = assert(g.lengths:to(place)) })
      assert.equal(place, got:placement())
      assert.same(want, got:totable(), place)
    end
    local fixed = ur.data.synthetic_spec { num_dense = 1, seed = 5, tables = { { rows = 30, hot = 2 }, { rows = 8 } } }
    local f = assert(ur.data.generate(fixed, 0, 3000))
    local wf = assert(ur.KJT.from_rows { keys = { "p", "q" }, hot = { 2, 1 }, ids = f.ids }):totable()
    local gf = assert(ur.KJT.from_rows { keys = { "p", "q" }, hot = { 2, 1 }, ids = assert(f.ids:to("device")) })
    assert.same(wf, gf:totable())
  end)

  cuda_it("names the devices of parts on two GPUs (from_rows, concat, a new KJT)", { gpus = 2 }, function()
    local ids = ur.tensor({ 2, 2 }, { dtype = "i64", placement = "device", device = 0 }):fill(0)
    local w = ur.tensor({ 2, 2 }, { placement = "device", device = 1 }):fill(1)
    assert.has_error(function()
      assert(ur.KJT.from_rows { keys = { "x", "y" }, hot = { 1, 1 }, ids = ids, weights = w })
    end, "kjt from_rows: weights is in device (device 1) but ids in device (device 0); one placement for all")
    local k0 = ur.KJT { keys = { "a" }, values = { 1, 2 }, lengths = { 1, 1 } }
    local a, b = k0:to("device", 0), ur.KJT { keys = { "b" }, values = { 3 }, lengths = { 1, 0 } }:to("device", 1)
    assert.has_error(function() ur.KJT.concat { a, b } end,
      "kjt concat: part 2 is in device (device 1) but part 1 in device (device 0); one placement for all")
    assert.has_error(function()
      ur.KJT { keys = { "a" }, values = ur.tensor({ 1 }, { dtype = "i64", placement = "device", device = 0 }),
               lengths = ur.tensor({ 1 }, { dtype = "i32", placement = "device", device = 1 }) }
    end, "kjt: lengths are in device (device 1) but values in device (device 0); one placement for all")
  end)

  cuda_it("finds the first bad position among many on a large batch", function()
    local o = random_lists(rng_of(99), 26, 4096, 3, 50, true)
    o.check = false
    o.lengths[17 * 4096 + 100] = -3 -- key 18, sample 99
    local rows = {}
    for i = 1, 26 do rows[i] = i < 9 and 50 or 20 end -- ids 20..49 of keys 9.. are out of range
    local want = outcome(o, "host", rows)
    assert.truthy(want:find("outside the table's 20 rows", 1, true), want)
    for _, place in ipairs(gpu_places) do assert.equal(want, outcome(o, place, rows), place) end
    for i = 1, 26 do rows[i] = 50 end
    want = outcome(o, "host", rows)
    assert.truthy(want:find("sample 99 (lengths[69731]) has length -3", 1, true), want)
    for _, place in ipairs(gpu_places) do assert.equal(want, outcome(o, place, rows), place) end
  end)
end)
