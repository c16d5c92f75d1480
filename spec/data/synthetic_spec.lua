local ur = require "uvmrec"
local h = require "helpers"
local data = ur.data

-- An exact AUC written here, independently of ur.data.auc: every (positive, negative) pair,
-- ties counting one half.
local function pairwise_auc(scores, labels)
  local num, pairs = 0, 0
  for i = 1, #scores do
    if labels[i] == 1 then
      for j = 1, #scores do
        if labels[j] == 0 then
          pairs = pairs + 1
          if scores[i] > scores[j] then num = num + 1 elseif scores[i] == scores[j] then num = num + 0.5 end
        end
      end
    end
  end
  return num / pairs
end

-- Logistic regression by Newton's method (float64) on rows x (lists) and 0/1 labels.
local function fit_logistic(x, y, d)
  local w = {}
  for j = 1, d + 1 do w[j] = 0 end
  for _ = 1, 12 do
    local g, hs = {}, {}
    for a = 1, d + 1 do
      g[a] = 0
      hs[a] = {}
      for b = 1, d + 1 do hs[a][b] = a == b and 1e-6 or 0 end
    end
    for i = 1, #y do
      local xi = x[i]
      local z = w[d + 1]
      for j = 1, d do z = z + w[j] * xi[j] end
      local p = 1 / (1 + math.exp(-z))
      local r, s = p - y[i], p * (1 - p)
      for a = 1, d + 1 do
        local xa = a <= d and xi[a] or 1
        g[a] = g[a] + r * xa
        local row = hs[a]
        for b = a, d + 1 do row[b] = row[b] + s * xa * (b <= d and xi[b] or 1) end
      end
    end
    for a = 1, d + 1 do for b = 1, a - 1 do hs[a][b] = hs[b][a] end end
    local step = require("uvmrec.planner.calib").solve(hs, g)
    for j = 1, d + 1 do w[j] = w[j] - step[j] end
  end
  return w
end


local U = require("ffi").typeof("uint64_t")

-- synth.h's stream key for a purpose (UR__S_LEN 3, UR__S_ID 4, the scatter's 99) and a table
local function skey(seed, purpose, t)
  local k = bit.bxor(U(seed), U(purpose) * 0x9E3779B97F4A7C15ULL, U(t) * 0xC2B2AE3D27D4EB4FULL)
  k = bit.bxor(k, bit.rshift(k, 29)) * 0xBF58476D1CE4E5B9ULL
  return bit.bxor(k, bit.rshift(k, 32))
end

local function gcd(a, b) while b ~= 0 do a, b = b, a % b end return a end

-- Table t's (0-based) id of Zipf rank `rank` (1-based) among `rows` ids: synth.c's scatter.
local function scatter(seed, t, rows, rank)
  local a = 0x9E3779B1 % rows
  if a == 0 then a = 1 end
  while gcd(a, rows) ~= 1 do a = a + 1 end
  local pb = h.philox(t, skey(seed, 99, 0)) % rows
  return tonumber((U(rank - 1) * (rows == 1 and 0 or a) + pb) % rows)
end

describe("uvmrec.data synthetic", function()
  it("computes an exact AUC, ties counting one half", function()
    local rng = 7
    for trial = 1, 20 do
      local s, l = {}, {}
      for i = 1, 40 + trial do
        rng = (rng * 1103515245 + 12345) % 2147483648
        s[i] = rng % 7 -- many ties
        l[i] = math.floor(rng / 8) % 3 == 0 and 1 or 0
      end
      l[1], l[2] = 1, 0
      h.near(data.auc(s, l), pairwise_auc(s, l), 1e-12, "auc")
    end
    assert.equal(1, data.auc({ 0.1, 0.9 }, { 0, 1 }))
    assert.equal(0.5, data.auc({ 0.3, 0.3 }, { 0, 1 }))
    assert.is_nil((data.auc({ 1, 2 }, { 1, 1 })))
  end)

  it("puts the signal in the sparse ids: dense-only logistic AUC <= 0.60, hidden AUC >= 0.80 (tiny)", function()
    local spec = data.synthetic_spec("tiny")
    local n = 20000
    local train = assert(data.generate(spec, 0, n))
    local test = assert(data.generate(spec, n, n, { probs = true }))
    local d = spec.num_dense
    local w = fit_logistic(h.rows(train.dense), train.labels:totable(), d)
    local xt, scores = h.rows(test.dense), {}
    for i = 1, n do
      local z = w[d + 1]
      for j = 1, d do z = z + w[j] * xt[i][j] end
      scores[i] = z
    end
    local labels = test.labels:totable()
    local dense_auc = data.auc(scores, labels)
    local ceiling = data.auc(test.probs:totable(), labels)
    assert.is_true(dense_auc <= 0.60, "dense-only AUC " .. dense_auc)
    assert.is_true(dense_auc > 0.5, "the dense features carry a little signal: " .. dense_auc)
    assert.is_true(ceiling >= 0.80, "hidden model AUC " .. ceiling)
  end)

  it("is deterministic for a seed, whatever the split into calls", function()
    local a = assert(data.generate("tiny", 100, 50))
    local b1 = assert(data.generate("tiny", 100, 20))
    local b2 = assert(data.generate("tiny", 120, 30))
    local ids = a.ids:totable()
    local joined = b1.ids:totable()
    for _, v in ipairs(b2.ids:totable()) do joined[#joined + 1] = v end
    assert.same(ids, joined)
    assert.same(a.dense:totable(0, 20 * 13), b1.dense:totable())
    local other = assert(data.generate(data.synthetic_spec("tiny", { seed = 99 }), 100, 50))
    assert.are_not.same(ids, other.ids:totable())
  end)

  it("draws ids in range with the asked skew, multi-hot lengths and weights", function()
    local spec = data.synthetic_spec {
      num_dense = 2, seed = 5, groups = 7,
      tables = { { rows = 1000, zipf = 1.2 }, { rows = 50, zipf = 0, hot = { 0, 4 }, weighted = true },
                 { rows = 3, hot = 3 } },
    }
    local n = 20000
    local g = assert(data.generate(spec, 0, n))
    assert.same({ n, 8 }, g.ids:size())
    local ids, lens, ws, groups = g.ids:totable(), g.lengths:totable(), g.weights:totable(), g.groups:totable()
    local count0, hist1, lens_seen = {}, {}, {}
    for i = 0, n - 1 do
      local id = ids[i * 8 + 1]
      assert.is_true(id >= 0 and id < 1000)
      count0[id] = (count0[id] or 0) + 1
      local l = lens[i * 3 + 2]
      lens_seen[l] = true
      assert.equal(1, lens[i * 3 + 1])
      assert.equal(3, lens[i * 3 + 3])
      for j = 1, 4 do
        local v, w = ids[i * 8 + 1 + j], ws[i * 8 + 1 + j]
        if j <= l then
          assert.is_true(v >= 0 and v < 50)
          assert.is_true(w > 0 and w <= 1)
          hist1[v] = (hist1[v] or 0) + 1
        else
          assert.equal(-1, v)
        end
      end
      assert.is_true(groups[i + 1] >= 0 and groups[i + 1] < 7)
    end
    for l = 0, 4 do assert.is_true(lens_seen[l], "length " .. l) end
    -- Zipf(1.2) over 1000 rows: the top id takes about 1/zeta-ish share; the ranks decay.
    local counts = {}
    for _, c in pairs(count0) do counts[#counts + 1] = c end
    table.sort(counts, function(a, b) return a > b end)
    local p1 = counts[1] / n
    -- P(rank 1) = 1 / H(1000, 1.2) = 0.2075 (computed in float64 here)
    local hsum = 0
    for k = 1, 1000 do hsum = hsum + k ^ -1.2 end
    h.near(p1, 1 / hsum, 0.05, "top id share")
    h.near(counts[2] / counts[1], 2 ^ -1.2, 0.1, "second/first")
    -- uniform table: every id seen, no id far above the mean
    local distinct, maxc = 0, 0
    for _, c in pairs(hist1) do distinct = distinct + 1; maxc = math.max(maxc, c) end
    assert.equal(50, distinct)
  end)

  it("rejects bad specs with the table named", function()
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 0 } } } end,
      "synthetic: table 1 has 0 rows; expected 1..2^40")
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 5 }, { rows = 5, hot = { 3, 2 } } } } end,
      "synthetic: table 2 has ids per sample 3..2; expected 0 <= min <= max, 1 <= max <= 4096")
    assert.has_error(function() data.synthetic_spec "huge" end,
      "synthetic: no preset 'huge'; presets are tiny, kaggle, mlperf_v1, mlperf_v1_2m, dcnv2, tiny_multihot")
    -- a misspelt key or a fraction is named (zipff fell back to uniform ids, sed to seed 0, rows 1.5 made 1 row)
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 5, zipff = 1.2 } } } end,
      "synthetic: table 1: unknown key 'zipff'; expected name, rows, zipf, hot, weighted, signal, id_space")
    assert.has_error(function() data.synthetic_spec { sed = 3, tables = { { rows = 5 } } } end,
      "synthetic: unknown key 'sed'; expected name, num_dense, seed, bias, dense_signal, signal_total, groups, "
      .. "drift, id_space_factor, tables")
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 1.5 } } } end,
      "synthetic: table 1 rows is 1.5; expected a whole number that fits i64")
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 5, hot = { 1, 2.5 } } } } end,
      "synthetic: table 1 hot[2] is 2.5; expected a whole number that fits i32")
    assert.has_error(function() data.synthetic_spec { seed = 1.5, tables = { { rows = 5 } } } end,
      "synthetic: seed is 1.5; expected a whole number that fits i64")
    assert.has_error(function() data.generate({ tables = { { rows = 5 } } }, 0.5, 4) end,
      "synthetic: first is 0.5; expected a whole number that fits i64")
    assert.has_error(function() data.generate({ tables = { { rows = 5 } } }, 0, -1) end,
      "synthetic: samples is -1; expected a whole number >= 0")
    -- a checked spec goes through again as it is
    local checked = data.synthetic_spec("tiny")
    assert.equal(26, data.synthetic_spec(checked).cspec.num_tables)
  end)

  it("has the presets' table sizes", function()
    local p = data.presets
    assert.equal(26, #p.kaggle.tables)
    assert.equal(10131227, p.kaggle.tables[3].rows)
    assert.equal(39884406, p.mlperf_v1.tables[1].rows)
    assert.equal(2000000, p.mlperf_v1_2m.tables[1].rows)
    assert.equal(36, p.mlperf_v1_2m.tables[26].rows)
    assert.equal(100, p.dcnv2.tables[21].hot)
    local dc = data.synthetic_spec("dcnv2")
    local g = assert(data.generate(dc, 0, 3))
    local hsum = 0
    for _, v in ipairs(p.dcnv2_hot) do hsum = hsum + v end
    assert.same({ 3, hsum }, g.ids:size())
  end)

  -- The ids of one column over samples first .. first + n - 1, most frequent first.
  local function ranked(spec, first, n)
    local g = assert(data.generate(spec, first, n))
    local count, ids = {}, {}
    for _, id in ipairs(g.ids:totable()) do
      if not count[id] then ids[#ids + 1] = id end
      count[id] = (count[id] or 0) + 1
    end
    table.sort(ids, function(a, b) return count[a] > count[b] or (count[a] == count[b] and a < b) end)
    return ids, count
  end

  it("draws ids from an id space larger than the table (id_space, id_space_factor)", function()
    local base = { seed = 3, num_dense = 1, tables = { { rows = 100, zipf = 1.05 } } }
    local wide = { seed = 3, num_dense = 1, tables = { { rows = 100, zipf = 1.05, id_space = 1000 } } }
    local ids, count = ranked(data.synthetic_spec(wide), 0, 20000)
    local top_outside, largest = 0, 0
    for k = 1, 100 do if ids[k] >= 100 then top_outside = top_outside + 1 end end
    for id in pairs(count) do largest = math.max(largest, id) end
    assert.is_true(largest < 1000 and largest >= 900, "ids span the space (largest " .. largest .. ")")
    assert.is_true(top_outside > 70, "the hot ids lie all over the space, not within rows")
    -- the factor gives the same spec; the table's rows as its space, the plain draw
    local f = data.synthetic_spec({ seed = 3, num_dense = 1, id_space_factor = 10,
                                    tables = { { rows = 100, zipf = 1.05 } } })
    assert.equal(1000, tonumber(f.cspec.tables[0].id_space))
    local same = { seed = 3, num_dense = 1, tables = { { rows = 100, zipf = 1.05, id_space = 100 } } }
    assert.same(assert(data.generate(base, 5, 500)).ids:totable(),
                assert(data.generate(same, 5, 500)).ids:totable())
    assert.has_error(function() data.synthetic_spec { tables = { { rows = 5, id_space = -2 } } } end,
      "synthetic: table 1 has an id space of -2; expected 1..2^40, or 0 (its rows)")
    -- a factor whose space is past 2^40 is named with the product (its int64_t cast was named:
    -- 'an id space of -9223372036854775808'); one that rounds to no id would read as the rows
    local function factor(x, rows)
      local err = select(2, pcall(data.synthetic_spec, { seed = 1, num_dense = 1, id_space_factor = x,
                                                         tables = { { rows = rows or 1e8 } } }))
      return (tostring(err):gsub("^[^\n]-:%d+: ", ""))
    end
    assert.equal("synthetic: table 1's id space, id_space_factor 1000000000000 x 100000000 rows, is 1e+20; "
      .. "expected 1 to 2^40", factor(1e12))
    assert.equal("synthetic: table 1's id space, id_space_factor 1.0000000000000001e-09 x 100 rows, is 0; "
      .. "expected 1 to 2^40", factor(1e-9, 100))
    local why = "expected a number >= 0 (ids drawn from that many times each table's rows; 0: the rows)"
    assert.equal("synthetic: id_space_factor is nan; " .. why, factor(0 / 0))
    assert.equal("synthetic: id_space_factor is -1; " .. why, factor(-1))
    assert.equal(0, tonumber(data.synthetic_spec({ seed = 1, num_dense = 1, id_space_factor = 0,
                                                   tables = { { rows = 7 } } }).cspec.tables[0].id_space))
  end)

  it("moves the hot ids with drift: rank r of sample i is the undrifted rank r + floor(i drift)", function()
    local function spec(drift)
      return data.synthetic_spec { num_dense = 1, seed = 3, drift = drift,
                                   tables = { { rows = 5000, zipf = 2.0 }, { rows = 50, zipf = 0 } } }
    end
    -- the most frequent ids of table 1 among n samples from first, most frequent first
    local function top(sp, first, n)
      local g = assert(data.generate(sp, first, n))
      local ids, counts, order = g.ids:totable(), {}, {}
      for i = 0, n - 1 do
        local id = ids[i * 2 + 1]
        if not counts[id] then order[#order + 1] = id end
        counts[id] = (counts[id] or 0) + 1
      end
      table.sort(order, function(a, b) return counts[a] > counts[b] end)
      return order
    end
    local plain = top(spec(0), 0, 10000)
    -- drift 1e-4: samples 10000m .. 10000m + 9999 read every rank m further on
    for m = 0, 2 do assert.equal(plain[m + 1], top(spec(1e-4), 10000 * m, 10000)[1], "window " .. m) end
    -- before the first whole rank of drift, the samples are the undrifted ones, bit for bit
    local a, b = assert(data.generate(spec(1e-4), 0, 9999)), assert(data.generate(spec(0), 0, 9999))
    assert.same(b.ids:totable(), a.ids:totable())
    assert.same(b.labels:totable(), a.labels:totable())
    assert.has_error(function() data.synthetic_spec { drift = -1, tables = { { rows = 5 } } } end,
      "synthetic: drift -1; expected 0 (none) to 1e6 ranks a sample")
  end)

  it("drifts over the whole id space: ids from past the rows rise, the hottest leave for the cold end", function()
    local function spec(drift)
      return data.synthetic_spec { num_dense = 1, seed = 4, drift = drift,
                                   tables = { { rows = 50, zipf = 2.0, id_space = 500 } } }
    end
    local plain = ranked(spec(0), 0, 20000)
    -- drift 1e-4: samples 20000 .. 29999 read every rank two further on
    local later, count = ranked(spec(1e-4), 20000, 10000)
    assert.same({ plain[3], plain[4] }, { later[1], later[2] })
    -- the two hottest ids are now the two coldest of 500 ranks
    assert.is_true((count[plain[1]] or 0) + (count[plain[2]] or 0) <= 1, "the hottest ids left the hot set")
    local beyond = 0
    for k = 1, 20 do if later[k] >= 50 then beyond = beyond + 1 end end
    assert.is_true(beyond > 10, "the hot ids lie past the table's rows")
  end)

  it("draws each of 200 and 1000 tables' ids as a reference written here does (uniform tables, Philox)", function()
    -- table t's (0-based) id at sample i, id slot j: a uniform rank, scattered by (pa, pb)
    local function ref_id(seed, t, rows, i, j)
      local v0, v1 = h.philox(i * 4096 + j, skey(seed, 4, t)) -- UR__S_ID
      local x = bit.bxor(bit.lshift(U(v0), 21), U(bit.rshift(v1, 11))) % (2ULL ^ 53)
      local rank = math.min(math.floor((tonumber(x) + 0.5) / 2 ^ 53 * rows) + 1, rows)
      return scatter(seed, t, rows, rank)
    end
    for _, T in ipairs { 200, 1000 } do
      local tabs = {}
      for t = 1, T do tabs[t] = { rows = 97 + t, zipf = 0, hot = t % 3 == 0 and 2 or 1 } end
      local spec = data.synthetic_spec { num_dense = 1, seed = 11, tables = tabs }
      local first, n = 5000, 8
      local g = assert(data.generate(spec, first, n))
      local H = g.ids:size(2)
      assert.equal(T + math.floor(T / 3), H)
      local ids, lens = g.ids:totable(), g.lengths:totable()
      local col0, c = {}, 0
      for t = 1, T do col0[t], c = c, c + tabs[t].hot end
      for _, t in ipairs { 1, 2, 3, 64, 65, 66, 150, T - 1, T } do
        for i = 0, n - 1 do
          assert.equal(tabs[t].hot, lens[i * T + t], ("%d tables: table %d's length at sample %d"):format(T, t, i))
          for j = 0, tabs[t].hot - 1 do
            assert.equal(ref_id(11, t - 1, tabs[t].rows, first + i, j), ids[i * H + col0[t] + j + 1],
              ("%d tables: table %d, sample %d, id %d"):format(T, t, first + i, j))
          end
        end
      end
    end
    local many = {}
    for t = 1, 65537 do many[t] = { rows = 2 } end
    assert.has_error(function() data.synthetic_spec { tables = many } end,
      "synthetic: 65537 tables; expected at most 65536")
  end)

  it("draws each table's bag lengths from a stream of its own, past 4096 tables too", function()
    -- a length's counter was sample * 4096 + table: table 4097's at sample i was table 1's at
    -- sample i + 1, so every length of table 4097 repeated one of table 1 (and so on up to 65536)
    -- table t (0-based): counter sample * 4096 + t mod 4096, its high word t / 4096 (0 below
    -- 4096 tables: the lengths drawn so far)
    local function ref_len(seed, t, i, lo, hi)
      local v0 = h.philox(i * 4096 + t % 4096, skey(seed, 3, 0), math.floor(t / 4096)) -- UR__S_LEN
      return lo + v0 % (hi - lo + 1)
    end
    local T, tabs = 4098, {}
    for t = 1, T do tabs[t] = { rows = 5, hot = 1 } end
    for _, t in ipairs { 1, 2, 4097, 4098 } do tabs[t].hot = { 0, 9 } end
    local first, n = 77, 40
    local g = assert(data.generate(data.synthetic_spec { num_dense = 1, seed = 21, tables = tabs }, first, n))
    local lens = g.lengths:totable()
    local same = 0
    for i = 0, n - 1 do
      for _, t in ipairs { 1, 2, 4097, 4098 } do
        assert.equal(ref_len(21, t - 1, first + i, 0, 9), lens[i * T + t], ("table %d, sample %d"):format(t, first + i))
      end
      if i + 1 < n and lens[i * T + 4097] == lens[(i + 1) * T + 1] then same = same + 1 end
    end
    assert.is_true(same < n / 3, ("table 4097's lengths repeat table 1's a sample on: %d of %d"):format(same, n - 1))
  end)

  it("draws a Zipf table's ids past 2^28 samples from tries of their own, not earlier samples' retries", function()
    -- a Zipf id's tries a = 0, 1, ... took counter sample * 4096 + slot + a * 2^40 in 64 bits:
    -- sample i + 2^28's first try was sample i's second, so wherever sample i's first try was
    -- rejected, sample i + 2^28 drew sample i's id.  Zipf 1.05 over 2^40 ids: two independent
    -- draws agree about once in 170, and about one first try in 900 is rejected
    local s, rows, seed = 1.05, 2 ^ 40, 9
    -- synth.h's rejection-inversion (Hoermann and Derflinger) in float64, with libm's exp and log
    -- (synth.h's own agree to an ulp or so: the same rank wherever it is below 2^20)
    local function helper1(x)
      if x > 1e-4 or x < -1e-4 then return math.log(1 + x) / x end
      return 1 - x * (0.5 - x * (1 / 3 - 0.25 * x))
    end
    local function helper2(x)
      if x > 1e-4 or x < -1e-4 then return (math.exp(x) - 1) / x end
      return 1 + x * 0.5 * (1 + x * (1 / 3) * (1 + 0.25 * x))
    end
    local function zh(x) return math.exp(-s * math.log(x)) end
    local function zH(x) return helper2((1 - s) * math.log(x)) * math.log(x) end
    local function zHinv(x) return math.exp(helper1(math.max(x * (1 - s), -1)) * x) end
    local hx1, hn, sv = zH(1.5) - 1, zH(rows + 0.5), 2 - zHinv(zH(2.5) - zh(2))
    -- sample i's id slot j, its first try (below 2^28 samples the counter's high word is 0): the
    -- rank and whether it is accepted
    local key = skey(seed, 4, 0) -- UR__S_ID, table 0
    local function first_try(i, j)
      local v0, v1 = h.philox(i * 4096 + j, key)
      local u = hn + (v0 * 2 ^ 21 + math.floor(v1 / 2048) + 0.5) / 2 ^ 53 * (hx1 - hn) -- ur__u53
      local x = zHinv(u)
      local k = math.min(math.max(math.floor(x + 0.5), 1), rows)
      return k, k - x <= sv or u >= zH(k + 0.5) - zh(k)
    end
    local spec = data.synthetic_spec { num_dense = 1, seed = seed, tables = { { rows = rows, zipf = s, hot = 4096 } } }
    local first, n = 1000, 16
    local a = assert(data.generate(spec, first, n)).ids:totable()
    local b = assert(data.generate(spec, 2 ^ 28 + first, n)).ids:totable()
    local rejected, same = 0, 0
    for i = 0, n - 1 do
      for j = 0, 4095 do
        local c, k, accepted = i * 4096 + j + 1, first_try(first + i, j)
        if not accepted then
          rejected = rejected + 1
          if a[c] == b[c] then same = same + 1 end
        elseif k < 2 ^ 20 then -- the reference is the engine's: an accepted first try is the id
          assert.equal(scatter(seed, 0, rows, k), a[c], ("sample %d, slot %d: rank %d"):format(first + i, j, k))
        end
      end
    end
    assert.is_true(rejected >= 40, ("%d first tries rejected in %d draws"):format(rejected, n * 4096))
    assert.is_true(same < rejected / 4, ("where sample i's first try was rejected, sample i + 2^28 drew sample i's id: "
      .. "%d of %d"):format(same, rejected))
  end)

  h.cuda_it("gives the same samples on the GPU as on the CPU", function()
    local drifting = data.synthetic_spec("tiny", { drift = 0.37 })
    local dc = assert(data.generate(drifting, 123456, 2000))
    local dg = assert(data.generate(drifting, 123456, 2000, { placement = "device" }))
    assert.same(dc.ids:totable(), dg.ids:totable(), "drifting ids")
    for _, over in ipairs { { groups = 10 }, { groups = 10, id_space_factor = 7, drift = 0.003 } } do
      local spec = data.synthetic_spec("tiny", over)
      local c = assert(data.generate(spec, 777, 3000, { probs = true }))
      local g = assert(data.generate(spec, 777, 3000, { probs = true, placement = "device" }))
      for _, k in ipairs { "dense", "labels", "ids", "lengths", "groups", "probs" } do
        assert.same(c[k]:totable(), g[k]:totable(), k)
      end
    end
    -- 1000 tables: their constants come from device memory, not the kernel's parameters
    local tabs = {}
    for t = 1, 1000 do tabs[t] = { rows = 50 + 13 * t, zipf = t % 2 == 0 and 1.1 or 0, hot = { 0, 1 + t % 3 },
                                   weighted = t % 5 == 0 } end
    local wide = data.synthetic_spec { num_dense = 3, seed = 8, groups = 4, tables = tabs }
    local c = assert(data.generate(wide, 99, 700, { probs = true }))
    local g = assert(data.generate(wide, 99, 700, { probs = true, placement = "device" }))
    for _, k in ipairs { "dense", "labels", "ids", "lengths", "weights", "groups", "probs" } do
      assert.same(c[k]:totable(), g[k]:totable(), "1000 tables: " .. k)
    end
  end)
end)
