-- uvmrec.metrics against plain float64 references written here: AUC by comparing every
-- positive with every negative (ties half), grouped AUC group by group, the histogram's AUC
-- by comparing bins, and the sums behind NE, log loss, accuracy, calibration and CTR.
local ffi = require "ffi"
local ur = require "uvmrec"
local metrics = require "uvmrec.metrics"
local h = require "helpers"
local C = ur.C

local f32 = ffi.new("float[1]")
local function round32(x)
  f32[0] = x
  return f32[0]
end

-- A tensor of shape holding list (row-major).
local function from(list, shape, opts)
  opts = opts or {}
  local dtype = opts.dtype or "f32"
  local t = assert(ur.tensor(shape, { dtype = dtype, placement = opts.placement or "host" }))
  local buf = ffi.new(dtype == "i64" and "int64_t[?]" or "float[?]", math.max(#list, 1))
  for i = 1, #list do buf[i - 1] = list[i] end
  assert(C.ur_tensor_write(t.p, 0, #list, buf) == 0, ffi.string(C.ur_last_error()))
  return t
end

-- n samples of T tasks: predictions in [0, 1) (on `levels` values when given, so with ties),
-- labels 0/1 that follow the predictions, weights per sample or per task, groups in [0, G).
local function batch(n, T, o)
  o = o or {}
  local b = { n = n, T = T, p = {}, y = {}, w = {}, g = {} }
  for i = 1, n * T do
    local v = math.random()
    if o.levels then v = math.floor(v * o.levels) / o.levels end
    b.p[i] = round32(v)
    b.y[i] = o.label or (math.random() < 0.15 + 0.7 * v and 1 or 0)
  end
  local nw = o.weights == "task" and n * T or n
  for i = 1, nw do b.w[i] = round32(o.big and 3e9 + math.random(0, 1000) * 2 ^ 20 or 0.5 + 1.5 * math.random()) end
  for i = 1, n do b.g[i] = math.random(0, (o.groups or 20) - 1) - 1000000 end
  b.weights = o.weights
  return b
end

local function tensors(b, placement)
  local shape = b.T == 1 and { b.n } or { b.n, b.T }
  local args = { predictions = from(b.p, shape, { placement = placement }),
                 labels = from(b.y, shape, { placement = placement }),
                 grouping_keys = from(b.g, { b.n }, { dtype = "i64", placement = placement }) }
  if b.weights == "task" then args.weights = from(b.w, shape, { placement = placement })
  elseif b.weights then args.weights = from(b.w, { b.n }, { placement = placement }) end
  return args
end

-- The samples of task t (1-based) of a list of batches, the last `last` of them when given.
local function samples(bs, t, last)
  local s = { p = {}, y = {}, w = {}, g = {} }
  for _, b in ipairs(bs) do
    for i = 1, b.n do
      local k = (i - 1) * b.T + t
      s.p[#s.p + 1] = b.p[k]
      s.y[#s.y + 1] = b.y[k]
      s.w[#s.w + 1] = not b.weights and 1 or b.weights == "task" and b.w[k] or b.w[i]
      s.g[#s.g + 1] = b.g[i]
    end
  end
  if last and last < #s.p then
    local cut = { p = {}, y = {}, w = {}, g = {} }
    for i = #s.p - last + 1, #s.p do
      for _, f in ipairs { "p", "y", "w", "g" } do cut[f][#cut[f] + 1] = s[f][i] end
    end
    s = cut
  end
  return s
end

-- Mann-Whitney by comparing every positive with every negative; key(i) ranks (default: p).
local function ref_auc(s, idx, key)
  key = key or s.p
  local num, P, N, negs = 0, 0, 0, {}
  for _, i in ipairs(idx) do
    local neg = s.w[i] * (1 - s.y[i])
    P, N = P + s.w[i] * s.y[i], N + neg
    if neg > 0 then negs[#negs + 1] = i end
  end
  for _, i in ipairs(idx) do
    local pos = s.w[i] * s.y[i]
    if pos > 0 then
      for _, j in ipairs(negs) do
        local a, b = key[i], key[j]
        if a > b then num = num + pos * s.w[j]
        elseif a == b then num = num + 0.5 * pos * s.w[j] end
      end
    end
  end
  if P > 0 and N > 0 then return num / (P * N), P, N end
  return 0.5, P, N
end

local function all(s)
  local idx = {}
  for i = 1, #s.p do idx[i] = i end
  return idx
end

local function ref_gauc(s)
  local groups, order = {}, {}
  for i = 1, #s.p do
    local g = s.g[i]
    if not groups[g] then groups[g] = {}; order[#order + 1] = g end
    table.insert(groups[g], i)
  end
  local sum, count = 0, 0
  for _, g in ipairs(order) do
    local a, P, N = ref_auc(s, groups[g])
    if P > 0 and N > 0 then sum, count = sum + a, count + 1 end
  end
  return count > 0 and sum / count or 0.5, count
end

local function bin_of(p, bins)
  if p ~= p or p <= 0 then return 0 end
  if p >= 1 then return bins - 1 end
  return math.min(math.floor(p * bins), bins - 1)
end

-- The histogram's AUC (pairs in one bin tie) and its bound, from the pairs themselves.
local function ref_hist(s, bins)
  local key = {}
  for i = 1, #s.p do key[i] = bin_of(s.p[i], bins) end
  local a, P, N = ref_auc(s, all(s), key)
  local ties = 0
  for i = 1, #s.p do
    for j = 1, #s.p do
      if key[i] == key[j] then ties = ties + s.w[i] * s.y[i] * s.w[j] * (1 - s.y[j]) end
    end
  end
  return a, (P > 0 and N > 0) and 0.5 * ties / (P * N) or 0
end

local ETA = 1e-12
-- log(1 - x) without losing x's digits when x is tiny (the classic log1p trick).
local function log1m(x)
  local u = 1 - x
  if u == 1 then return -x end
  return math.log(u) * -x / (u - 1)
end

local function ref_sums(s, threshold)
  local w, pos, neg, wp, ce, right = 0, 0, 0, 0, 0, 0
  for i = 1, #s.p do
    local p, y, wi = s.p[i], s.y[i], s.w[i]
    local pc = math.min(math.max(p, ETA), 1 - ETA)
    w, pos, neg, wp = w + wi, pos + wi * y, neg + wi * (1 - y), wp + wi * p
    ce = ce - (wi * y * math.log(pc) + wi * (1 - y) * log1m(pc))
    right = right + (p >= (threshold or 0.5) and wi * y or wi * (1 - y))
  end
  local base = math.min(math.max(pos / math.max(w, ETA), ETA), 1 - ETA)
  local entropy = -(pos * math.log(base) + neg * log1m(base))
  return { weight = w, positive = pos, negative = neg, samples = #s.p,
           ctr = pos / math.max(w, ETA), calibration = wp / math.max(pos, ETA),
           accuracy = right / math.max(w, ETA), logloss = ce / math.max(w, ETA),
           ne = ce / math.max(entropy, ETA) }
end

local function near(a, b, tol, what)
  h.near(a, b, tol or 1e-9, what)
end

local function check_sums(v, s, what, threshold)
  local r = ref_sums(s, threshold)
  for k, x in pairs(r) do
    -- a value one class leaves undefined is nil (the tests of one class say which)
    if v[k .. "_undefined"] then assert.is_nil(v[k], what .. " " .. k) else near(v[k], x, 1e-9, what .. " " .. k) end
  end
end

local function feed(m, bs, placement)
  for _, b in ipairs(bs) do assert(m:update(tensors(b, placement))) end
end

local function no_nan(t, what)
  for k, v in pairs(t) do
    if type(v) == "table" then no_nan(v, what .. "." .. k)
    elseif type(v) ~= "string" then -- not auc_undefined's reason
      assert.is_true(v == v and v > -math.huge and v < math.huge, what .. "." .. k .. " = " .. tostring(v)) end
  end
end

-- Samples outside the definitions (a label outside [0, 1], a weight below 0, a prediction, label
-- or weight not finite), one in task b of a batch: compute fails naming the task and the counts,
-- keeps the state (reset() drops it); finite predictions outside [0, 1] (scores), weights of 0
-- and labels of exactly 0 and 1 are inside them.  The metric's state in `place`, its inputs in
-- `input`.
local function refuses_bad_samples(place, input)
  local function collection()
    return metrics.MetricCollection { metrics = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" },
                                      tasks = { "a", "b" }, batch_size = 8, window_size = 16,
                                      placement = place }
  end
  local inf, nan = math.huge, 0 / 0
  local cases = { { "y", 2 }, { "y", -0.5 }, { "y", nan }, { "w", -1 }, { "w", inf }, { "w", nan },
                  { "p", nan }, { "p", inf }, { "p", -inf } }
  for _, c in ipairs(cases) do
    local what = ("%s = %s"):format(c[1], tostring(c[2]))
    local m = collection()
    local good, bad = batch(8, 2, { weights = "task", groups = 3 }), batch(8, 2, { weights = "task", groups = 3 })
    bad[c[1]][2 * 5] = c[2] -- sample 5, task b
    feed(m, { good, bad }, input)
    local ok, err = pcall(m.compute, m)
    assert.is_false(ok, what)
    assert.matches("metrics compute: task b holds samples with a label outside %[0, 1%], a weight below 0, or a "
                   .. "prediction, label or weight that is not finite: 1 in the lifetime since reset, 1 in the "
                   .. "window; expected labels in %[0, 1%], weights of 0 or more and finite predictions %(the state "
                   .. "is kept; reset%(%) drops it%)", tostring(err), nil, what)
    assert.equal(16, m:seen(), what)
    -- two more good batches push it out of the window (16 samples), not out of the lifetime
    feed(m, { good, good }, input)
    assert.matches("1 in the lifetime since reset, 0 in the window", tostring(select(2, pcall(m.compute, m))),
                   nil, what)
    m:reset()
    feed(m, { good }, input)
    no_nan(assert(m:values()), what)
  end
  -- the edges inside: labels 0 and 1, weight 0, finite scores outside [0, 1]
  local m = collection()
  local b = batch(8, 2, { weights = "task", groups = 3 })
  b.y[1], b.y[2], b.w[3], b.p[4], b.p[5] = 0, 1, 0, -3.5, 7.25
  feed(m, { b }, input)
  no_nan(assert(m:values()), "edges")
end

describe("uvmrec.metrics", function()
  before_each(function() math.randomseed(7) end)

  it("computes AUC over the window exactly, ties counting half, as every pair compared", function()
    local bs = { batch(300, 1, { levels = 25 }), batch(250, 1, { levels = 25 }), batch(200, 1) }
    local m = metrics.AUC { tasks = { "ctr" }, batch_size = 300, window_size = 1000, placement = "host" }
    feed(m, bs)
    local r = assert(m:compute())
    local s = samples(bs, 1)
    near(r["auc-ctr|window_auc"], ref_auc(s, all(s)), 1e-12, "window auc")
    assert.is_true(r["auc-ctr|window_auc"] > 0.6)
  end)

  it("keeps only the last window_size samples in the window, across batches", function()
    local bs = {}
    for i = 1, 7 do bs[i] = batch(90 + 13 * i, 2, { levels = 40, weights = "task" }) end
    local m = metrics.MetricCollection { metrics = { "auc", "ne", "ctr" }, tasks = { "a", "b" },
                                         batch_size = 200, window_size = 333, placement = "host" }
    for k, b in ipairs(bs) do
      assert(m:update(tensors(b)))
      if k == 1 or k == 3 or k == 7 then
        local v = assert(m:values())
        for t, name in ipairs { "a", "b" } do
          local s = samples({ unpack(bs, 1, k) }, t, 333)
          near(v[name].window.auc, ref_auc(s, all(s)), 1e-12, name .. " auc after " .. k)
          check_sums(v[name].window, s, name .. " window after " .. k)
          check_sums(v[name].lifetime, samples({ unpack(bs, 1, k) }, t), name .. " lifetime after " .. k)
        end
      end
    end
    assert.equal(90 * 7 + 13 * 28, m:seen())
  end)

  it("takes a batch larger than the window: its last samples remain", function()
    local b = batch(500, 1, { levels = 10 })
    local m = metrics.AUC { batch_size = 500, window_size = 64, placement = "host" }
    feed(m, { b })
    local s = samples({ b }, 1, 64)
    near(assert(m:compute())["auc-default|window_auc"], ref_auc(s, all(s)), 1e-12, "auc")
  end)

  it("gives a lifetime AUC from the histogram within its stated bound of the exact AUC", function()
    local bs = { batch(400, 3, { weights = "task" }), batch(300, 3, { weights = "task" }) }
    for _, bins in ipairs { 1, 7, 64, 65536 } do
      local m = metrics.AUC { tasks = { "x", "y", "z" }, batch_size = 400, window_size = 700,
                              lifetime_bins = bins, placement = "host" }
      feed(m, bs)
      local r = assert(m:compute())
      for t, name in ipairs { "x", "y", "z" } do
        local s = samples(bs, t)
        local exact = ref_auc(s, all(s))
        local hist, bound = ref_hist(s, bins)
        local got, err = r["auc-" .. name .. "|lifetime_auc"], r["auc-" .. name .. "|lifetime_auc_error"]
        near(got, hist, 1e-12, bins .. " bins: histogram auc")
        near(err, bound, 1e-12, bins .. " bins: bound")
        assert.is_true(math.abs(got - exact) <= err + 1e-12, bins .. " bins: within the bound")
        near(r["auc-" .. name .. "|window_auc"], exact, 1e-12, "window auc")
        if bins == 65536 then assert.is_true(err < 1e-3, "fine bins: small bound") end
        if bins == 1 then near(got, 0.5, 1e-15, "one bin: all tied") end
      end
    end
  end)

  it("computes NE, log loss, accuracy, calibration and CTR like float64 sums, weighted, per task", function()
    for _, weights in ipairs { false, "sample", "task" } do
      local bs = { batch(200, 2, { weights = weights }), batch(150, 2, { weights = weights }) }
      local m = metrics.MetricCollection { metrics = { metrics.NE, metrics.Accuracy, metrics.Calibration,
                                                       metrics.CTR },
                                           tasks = { "click", "like" }, batch_size = 200,
                                           window_size = 180, include_logloss = true, threshold = 0.4,
                                           placement = "host" }
      feed(m, bs)
      local r = assert(m:compute())
      for t, name in ipairs { "click", "like" } do
        local life, win = ref_sums(samples(bs, t), 0.4), ref_sums(samples(bs, t, 180), 0.4)
        for _, k in ipairs { "ne", "logloss", "accuracy", "calibration", "ctr" } do
          local prefix = (k == "logloss" and "ne" or k) .. "-" .. name .. "|"
          near(r[prefix .. "window_" .. k], win[k], 1e-9, tostring(weights) .. " window " .. k)
          near(r[prefix .. "lifetime_" .. k], life[k], 1e-9, tostring(weights) .. " lifetime " .. k)
        end
      end
      assert.is_nil(r["auc-click|window_auc"])
    end
  end)

  it("averages the AUCs of the groups that hold both classes (grouped AUC)", function()
    local bs = { batch(300, 2, { levels = 30, groups = 25 }), batch(200, 2, { groups = 25 }) }
    local m = metrics.GroupedAUC { tasks = { "a", "b" }, batch_size = 300, window_size = 420,
                                   placement = "host" }
    feed(m, bs)
    local r = assert(m:compute())
    for t, name in ipairs { "a", "b" } do
      local s = samples(bs, t, 420)
      local want, count = ref_gauc(s)
      near(r["gauc-" .. name .. "|window_gauc"], want, 1e-12, name .. " gauc")
      assert.equal(count, r["gauc-" .. name .. "|window_gauc_num_groups"])
      assert.is_true(count > 15 and count <= 25)
    end
  end)

  it("leaves AUC, NE, calibration and grouped AUC undefined, saying why, for one class and no samples; no NaN",
     function()
    -- one class gave AUC 0.5, which reads as a result (a one-sample evaluation printed 'AUC 0.5000'),
    -- and NE and calibration near 1e12 (their denominators clamped at eta)
    local opts = { metrics = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" },
                   tasks = { "t" }, batch_size = 64, window_size = 64, include_logloss = true,
                   placement = "host" }
    local empty = metrics.MetricCollection(opts)
    local r = assert(empty:compute())
    no_nan(r, "empty")
    local v = assert(empty:values()).t
    no_nan(v, "empty values")
    for _, k in ipairs { "auc-t|window_auc", "auc-t|lifetime_auc", "auc-t|lifetime_auc_error", "ne-t|window_ne",
                         "ne-t|lifetime_ne", "calibration-t|window_calibration" } do
      assert.is_nil(r[k], k)
    end
    assert.same({ "no label", "no label" }, { v.window.ne_undefined, v.lifetime.calibration_undefined })
    assert.same({ "no label", "no label" }, { v.window.auc_undefined, v.lifetime.auc_undefined })
    assert.is_nil(v.window.auc)
    assert.is_nil(r["gauc-t|window_gauc"]) -- was 0.5, the mean of no group's AUC
    assert.equal(0, r["gauc-t|window_gauc_num_groups"])
    assert.equal("no group holds both classes", v.window.grouped_auc_undefined)
    assert.is_nil(v.window.grouped_auc)
    for _, label in ipairs { 0, 1 } do
      local m = metrics.MetricCollection(opts)
      local b = batch(64, 1, { label = label, weights = "sample" })
      feed(m, { b })
      r = assert(m:compute())
      no_nan(r, "label " .. label)
      assert.is_nil(r["auc-t|window_auc"])
      assert.is_nil(r["auc-t|lifetime_auc"])
      assert.is_nil(r["auc-t|lifetime_auc_error"])
      assert.is_nil(r["ne-t|window_ne"])
      assert.is_nil(r["ne-t|lifetime_ne"])
      assert.is_number(r["ne-t|window_logloss"])
      -- calibration is over the positive weight: defined when every label is 1
      if label == 1 then assert.is_number(r["calibration-t|window_calibration"])
      else assert.is_nil(r["calibration-t|window_calibration"]) end
      assert.is_nil(r["gauc-t|window_gauc"])
      assert.equal(label, r["ctr-t|window_ctr"])
      v = assert(m:values()).t
      check_sums(v.window, samples({ b }, 1), "one class", 0.5)
      assert.is_nil(v.window.auc)
      assert.is_nil(v.lifetime.auc_error)
      assert.equal(("all 64 labels are %d by weight"):format(label), v.window.auc_undefined)
      assert.equal(v.window.auc_undefined, v.lifetime.auc_undefined)
      assert.equal(v.window.auc_undefined, v.window.ne_undefined)
      assert.is_nil(v.window.ne)
      assert.equal(label == 0 and v.window.auc_undefined or nil, v.window.calibration_undefined)
      if label == 1 then near(v.window.calibration, ref_sums(samples({ b }, 1)).calibration, 1e-9, "calibration") end
    end
    -- unweighted, and one sample: what a one-sample evaluation says
    local one = metrics.AUC { batch_size = 1, placement = "host" }
    feed(one, { batch(1, 1, { label = 0 }) })
    assert.equal("the 1 label is 0", assert(one:values()).default.window.auc_undefined)
    assert.equal("the 1 held-out label is 0", metrics.auc_undefined(assert(one:values()).default.window,
                                                                   "held-out label"))
    -- both classes: defined, no reason
    local both = metrics.AUC { batch_size = 64, placement = "host" }
    feed(both, { batch(64, 1) })
    v = assert(both:values()).default.window
    assert.is_number(v.auc)
    assert.is_nil(v.auc_undefined)
    local u = metrics.undefined(v)
    assert.same({ nil, nil, nil }, { u.auc, u.ne, u.calibration })
    assert.is_nil(v.grouped_auc_undefined, "no grouped AUC asked for: nothing said of it")
  end)

  it("gives no AUC in values() for a scope that computes none (the engine's 0 read as the worst ranking)", function()
    -- AUC{window_size = 0}:values().default.window.auc was 0, and lifetime.auc 0 without bins,
    -- where compute() had no key: an AUC of 0 for data both classes ranked perfectly
    local b = batch(64, 1)
    local cases = {
      { metrics.AUC { batch_size = 64, window_size = 0, placement = "host" }, "lifetime", "window" },
      { metrics.AUC { batch_size = 64, lifetime_bins = 0, placement = "host" }, "window", "lifetime" },
    }
    for _, c in ipairs(cases) do
      local m, has, hasnt = c[1], c[2], c[3]
      feed(m, { b })
      local v = assert(m:values()).default
      assert.is_number(v[has].auc, has)
      assert.same({}, { v[hasnt].auc, v[hasnt].auc_error, v[hasnt].auc_undefined }, hasnt)
      assert.is_nil(assert(m:compute())["auc-default|" .. hasnt .. "_auc"])
    end
    -- a kind not asked for: no AUC, no grouped AUC or its count of groups
    local ne = metrics.NE { batch_size = 64, placement = "host" }
    feed(ne, { b })
    local v = assert(ne:values()).default
    for _, scope in ipairs { "window", "lifetime" } do
      assert.same({}, { v[scope].auc, v[scope].auc_error, v[scope].grouped_auc, v[scope].groups }, scope)
      assert.is_number(v[scope].ne, scope)
    end
    local g = metrics.GroupedAUC { batch_size = 64, placement = "host" }
    feed(g, { batch(64, 1, { groups = 4 }) })
    v = assert(g:values()).default
    assert.is_number(v.window.grouped_auc)
    assert.is_true(v.window.groups > 0)
    assert.same({}, { v.window.auc, v.lifetime.auc, v.lifetime.grouped_auc, v.lifetime.groups })
  end)

  it("counts weights past 2^32 exactly, and samples past 2^32 in f64 state", function()
    local bs = { batch(300, 1, { big = true, weights = "sample", levels = 50 }),
                 batch(200, 1, { big = true, weights = "sample" }) }
    local m = metrics.MetricCollection { metrics = { "auc", "ctr" }, batch_size = 300,
                                         window_size = 500, lifetime_bins = 50, placement = "host" }
    feed(m, bs)
    local v = assert(m:values()).default
    local s = samples(bs, 1)
    local r = ref_sums(s)
    assert.is_true(r.weight > 2 ^ 40)
    -- Weights are whole multiples of 2^20 below 2^33: the sums are exact in f64.
    assert.equal(r.weight, v.lifetime.weight)
    assert.equal(r.positive, v.lifetime.positive)
    assert.equal(r.weight, v.window.weight)
    near(v.window.auc, ref_auc(s, all(s)), 1e-12, "window auc")
    near(v.lifetime.auc, ref_hist(s, 50), 1e-12, "lifetime auc")
    assert.equal(500, v.lifetime.samples)
    -- The sample count lives in the f64 state; a reduction can take it past 2^32.
    local big = metrics.CTR { batch_size = 8, window_size = 0, placement = "host",
                              reduce = function(st)
                                local p = st.lifetime.ptr
                                for i = 0, st.lifetime.count - 1 do p[i] = p[i] * 2 ^ 31 end
                              end }
    feed(big, { batch(8, 1) })
    local lv = assert(big:values()).default.lifetime
    assert.equal(2 ^ 34, lv.samples)
    assert.equal(8 * 2 ^ 31, lv.weight)
  end)

  it("computes every kind of a MetricCollection from one state, as the single metrics do", function()
    local bs = { batch(250, 2, { levels = 20, weights = "sample" }), batch(250, 2, { weights = "sample" }) }
    local opts = { tasks = { "a", "b" }, batch_size = 250, window_size = 400, include_logloss = true,
                   placement = "host" }
    local all_kinds = {}
    for k, v in pairs(opts) do all_kinds[k] = v end
    all_kinds.metrics = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" }
    local coll = metrics.MetricCollection(all_kinds)
    feed(coll, bs)
    local got = assert(coll:compute())
    local n = 0
    for _, cls in ipairs { metrics.AUC, metrics.GroupedAUC, metrics.NE, metrics.Accuracy,
                           metrics.Calibration, metrics.CTR } do
      local m = cls(opts)
      feed(m, bs)
      for k, v in pairs(assert(m:compute())) do
        assert.equal(v, got[k], k)
        n = n + 1
      end
    end
    local keys = 0
    for _ in pairs(got) do keys = keys + 1 end
    assert.equal(n, keys)
    assert.equal(2 * (3 + 2 + 4 + 2 + 2 + 2), keys)
  end)

  it("calls reduce with the lifetime state and the window: summing ranks gives the whole job's metrics", function()
    local b1, b2 = batch(200, 2, { levels = 30, groups = 10 }), batch(150, 2, { levels = 30, groups = 10 })
    local opts = { metrics = { "auc", "gauc", "ne" }, tasks = { "a", "b" }, batch_size = 200,
                   window_size = 400, lifetime_bins = 100, placement = "host" }
    local rank1 = metrics.MetricCollection(opts)
    feed(rank1, { b2 })
    local calls = 0
    opts.reduce = function(st)
      calls = calls + 1
      local other = assert(rank1:state())
      assert.equal(other.lifetime.count, st.lifetime.count)
      for i = 0, st.lifetime.count - 1 do st.lifetime.ptr[i] = st.lifetime.ptr[i] + other.lifetime.ptr[i] end
      local w, o = st.window, other.window
      local n1, n2 = w.predictions:size(1), o.predictions:size(1)
      local out = {}
      for _, k in ipairs { "predictions", "labels", "weights", "grouping_keys" } do
        local shape = w[k]:size()
        shape[1] = n1 + n2
        out[k] = ur.tensor(shape, { dtype = w[k]:dtype() })
        out[k]:view(0, n1):copy(w[k])
        out[k]:view(n1, n2):copy(o[k])
      end
      return out
    end
    local rank0 = metrics.MetricCollection(opts)
    feed(rank0, { b1 })
    opts.reduce = nil
    local whole = metrics.MetricCollection(opts)
    feed(whole, { b1, b2 })
    local got, want = assert(rank0:compute()), assert(whole:compute())
    assert.equal(1, calls)
    for k, v in pairs(want) do near(got[k], v, 1e-12, k) end
    -- The live state is untouched: without the other rank, rank 0 is itself again.
    rank0.reduce = nil
    local alone = metrics.MetricCollection { metrics = { "auc", "gauc", "ne" }, tasks = { "a", "b" },
                                             batch_size = 200, window_size = 400, lifetime_bins = 100,
                                             placement = "host" }
    feed(alone, { b1 })
    for k, v in pairs(assert(alone:compute())) do near(assert(rank0:compute())[k], v, 1e-15, k) end
  end)

  it("starts over after reset", function()
    local m = metrics.AUC { batch_size = 100, window_size = 100, placement = "host" }
    feed(m, { batch(100, 1) })
    m:reset()
    assert.equal(0, m:seen())
    local b = batch(80, 1, { levels = 9 })
    feed(m, { b })
    local s = samples({ b }, 1)
    local r = assert(m:compute())
    near(r["auc-default|window_auc"], ref_auc(s, all(s)), 1e-12, "window")
    near(r["auc-default|lifetime_auc"], ref_hist(s, 65536), 1e-12, "lifetime")
  end)

  it("reads pinned and managed inputs on the CPU", function()
    local b = batch(120, 2, { levels = 12, weights = "task" })
    local want
    for _, place in ipairs { "host", "pinned", "managed" } do
      local m = metrics.MetricCollection { metrics = { "auc", "ne" }, tasks = { "a", "b" }, batch_size = 120,
                                           placement = "host" }
      feed(m, { b }, place)
      local r = assert(m:compute())
      want = want or r
      assert.same(want, r, place)
    end
    local s = samples({ b }, 2)
    near(want["auc-b|window_auc"], ref_auc(s, all(s)), 1e-12, "auc b")
  end)

  it("describes itself and frees once", function()
    local m = metrics.MetricCollection { metrics = { "auc", metrics.NE }, tasks = { "ctr" }, batch_size = 32,
                                         placement = "host" }
    assert.equal("metrics {auc, ne} tasks {ctr} window 3200 bins 65536, host (CPU)", tostring(m))
    m:free()
    m:free()
    assert.equal("metrics (freed)", tostring(m))
    assert.has_error(function() m:compute() end, "metrics: used after free()")
  end)

  describe("rejects misuse with messages naming the value", function()
    local function m1(extra)
      local o = { tasks = { "a", "b" }, batch_size = 16, placement = "host" }
      for k, v in pairs(extra or {}) do o[k] = v end
      return metrics.MetricCollection(o)
    end
    local function msg(fn) local ok, e = pcall(fn) assert.is_false(ok) return tostring(e) end

    it("bad options", function()
      assert.matches("metrics: unknown option 'windowsize'; expected batch_size, comm, device, eta, "
                     .. "include_logloss, lifetime_bins, my_rank, placement, rank, reduce, tasks, threshold, "
                     .. "window_size, world_size$", msg(function() metrics.AUC { batch_size = 4, windowsize = 3 } end))
      assert.matches("batch_size is nil; expected a whole number >= 1", msg(function() metrics.AUC {} end))
      assert.matches("window_size is %-1", msg(function() metrics.AUC { batch_size = 4, window_size = -1 } end))
      -- past 2^63 a cast made them -2^63: 'a window of -9223372036854775808 samples'
      assert.matches("metrics: batch_size is inf; expected a whole number below 2^63",
                     msg(function() metrics.AUC { batch_size = 1 / 0 } end), 1, true)
      assert.matches("metrics: window_size is 1.844674407371e+19; expected a whole number below 2^63",
                     msg(function() metrics.AUC { batch_size = 4, window_size = 2 ^ 64 } end), 1, true)
      assert.matches("tasks must be a non%-empty list", msg(function() metrics.NE { batch_size = 4, tasks = {} } end))
      assert.matches("task 'a' is listed twice",
                     msg(function() metrics.NE { batch_size = 4, tasks = { "a", "a" } } end))
      assert.matches("grouped AUC is computed over the window, and window_size is 0",
                     msg(function() metrics.GroupedAUC { batch_size = 4, window_size = 0 } end))
      assert.matches("metric 2 is bogus; expected one of auc, gauc",
                     msg(function() m1 { metrics = { "auc", "bogus" } } end))
      assert.matches("needs metrics = a list", msg(function() metrics.MetricCollection { batch_size = 4 } end))
      assert.matches("reduce must be a function", msg(function() metrics.CTR { batch_size = 4, reduce = 3 } end))
      assert.matches("'mars' is not a placement",
                     msg(function() metrics.CTR { batch_size = 4, placement = "mars" } end))
      assert.matches("eta 0.7 is outside %(0, 0.5%)", msg(function() metrics.NE { batch_size = 4, eta = 0.7 } end))
      assert.matches("accuracy threshold inf is not finite",
                     msg(function() metrics.Accuracy { batch_size = 4, threshold = math.huge } end))
      -- a string failed in ffi, and any value but false and nil turned log loss on
      assert.matches("metrics: threshold is string; expected a number",
                     msg(function() metrics.Accuracy { batch_size = 4, threshold = "0.5" } end))
      assert.matches("metrics: eta is string; expected a number",
                     msg(function() metrics.NE { batch_size = 4, eta = "x" } end))
      assert.matches("metrics: include_logloss is no; expected true or false",
                     msg(function() metrics.NE { batch_size = 4, include_logloss = "no" } end))
      assert.matches("%d+ histogram bins; expected 0 %(no lifetime AUC%) to 16777216",
                     msg(function() metrics.AUC { batch_size = 4, lifetime_bins = 2 ^ 25 } end))
      assert.matches("a window of 4294967296 samples; expected 0 to 2147483647",
                     msg(function() metrics.AUC { batch_size = 4, window_size = 2 ^ 32 } end))
      local o = ffi.new("ur_metrics_opts", { tasks = 2000, window = 1, eta = 1e-12 })
      local out = ffi.new("ur_metrics *[1]")
      assert.equal(C.UR_STATUS_INVALID, C.ur_metrics_new(out, o, C.UR_PLACE_HOST, -1))
      assert.matches("metrics: 2000 tasks; expected 1 to 1024", ffi.string(C.ur_last_error()))
    end)

    it("bad inputs", function()
      local m = m1 { metrics = { "auc", "gauc" } }
      local p, y = ur.tensor({ 8, 2 }):uniform(0, 1, 1), ur.tensor({ 8, 2 }):fill(1)
      local g = ur.tensor({ 8 }, { dtype = "i64" }):fill(3)
      assert.matches("predictions are f32 %[8%] but the metric has 2 tasks; expected f32 %[n, 2%]",
                     msg(function() m:update { predictions = ur.tensor { 8 }, labels = y, grouping_keys = g } end))
      assert.matches("predictions are bf16 %[8, 2%]",
                     msg(function() m:update { predictions = ur.tensor({ 8, 2 }, { dtype = "bf16" }), labels = y } end))
      assert.matches("labels are f32 %[8, 3%] but predictions are f32 %[8, 2%]; expected the same shape",
                     msg(function() m:update { predictions = p, labels = ur.tensor { 8, 3 }, grouping_keys = g } end))
      assert.matches("weights are f32 %[4%]; expected f32 %[8%] or %[8, 2%]",
                     msg(function() m:update { p, y, ur.tensor { 4 }, g } end))
      assert.matches("grouping keys are i32 %[8%]; expected i64 %[8%]",
                     msg(function() m:update { p, y, nil, ur.tensor({ 8 }, { dtype = "i32" }) } end))
      assert.matches("grouped AUC needs grouping keys %(i64 %[8%]%), and none were given",
                     msg(function() m:update { predictions = p, labels = y } end))
      assert.matches("labels must be a tensor, got nil", msg(function() m:update { predictions = p } end))
      assert.matches("expected a table", msg(function() m:update(p) end))
      -- a misspelt key is named: weight = was ignored, every sample weighing 1
      assert.matches("metrics update: unknown key 'weight'; expected predictions, labels, weights, grouping_keys, "
                     .. "stream %(or the first four by position%)",
                     msg(function() m:update { predictions = p, labels = y, weight = p, grouping_keys = g } end))
      assert.equal(0, m:seen())
      assert.matches("metrics_spec.lua", msg(function() m:update { predictions = p } end))
      assert(m:update { p, y, nil, g })
      assert.equal(8, m:seen())
    end)

    it("bad samples: compute fails naming the task and the counts, and keeps the state", function()
      refuses_bad_samples("host", "host")
    end)
  end)

  describe("on CUDA", function()
    local function compare(a, b, tol, what)
      for name, scopes in pairs(b) do
        for scope, vals in pairs(scopes) do
          for k, v in pairs(vals) do
            local at = ("%s %s %s %s"):format(what, name, scope, k)
            if type(v) == "string" then assert.equal(v, a[name][scope][k], at)
            else h.near(a[name][scope][k], v, tol, at) end
          end
        end
      end
    end

    h.cuda_it("matches the CPU for every kind, with ties, weights and groups", function()
      local bs = { batch(700, 3, { levels = 40, weights = "task", groups = 30 }),
                   batch(500, 3, { weights = "task", groups = 30 }), batch(600, 3, { levels = 7, groups = 30 }) }
      for _, place in ipairs { "device", "managed" } do
        local opts = { metrics = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" },
                       tasks = { "a", "b", "c" }, batch_size = 700, window_size = 1500, lifetime_bins = 4096,
                       include_logloss = true }
        opts.placement = "host"
        local cpu = metrics.MetricCollection(opts)
        opts.placement = place
        local gpu = metrics.MetricCollection(opts)
        assert.is_true(gpu:on_gpu())
        feed(cpu, bs)
        feed(gpu, bs, place == "device" and "device" or "pinned")
        compare(assert(gpu:values()), assert(cpu:values()), 1e-10, place)
        local s = samples(bs, 2, 1500)
        h.near(assert(gpu:values()).b.window.auc, ref_auc(s, all(s)), 1e-12, "auc vs reference")
      end
    end)

    h.cuda_it("matches the CPU on a large window of soft labels and many groups", function()
      local n, T = 300000, 2
      if os.getenv("UVMREC_SANITIZER") then n = 30000 end -- instrumented sorts crawl
      local p = ur.tensor({ n, T }):uniform(0, 1, 11)
      local y = ur.tensor({ n, T }):uniform(0, 1, 12)
      local w = ur.tensor({ n }):uniform(0.1, 3, 13)
      local g = ur.tensor({ n }, { dtype = "i64" }):uniform(-5000, 5000, 14)
      local opts = { metrics = { "auc", "gauc", "ne", "accuracy" }, tasks = { "a", "b" }, batch_size = n,
                     window_size = n * 5 / 6, placement = "host" }
      local cpu = metrics.MetricCollection(opts)
      opts.placement = "device"
      local gpu = metrics.MetricCollection(opts)
      assert(cpu:update { p, y, w, g })
      assert(gpu:update { p:to("device"), y:to("device"), w:to("device"), g:to("device") })
      local a, b = assert(gpu:values()), assert(cpu:values())
      compare(a, b, 1e-9, "large")
      assert.is_true(a.a.window.groups > 9000 * n / 300000)
    end)

    h.cuda_it("counts past 2^32 samples on the device, exactly", function()
      local n, reps = 2 ^ 26, 65
      local sanitized = os.getenv("UVMREC_SANITIZER") ~= nil
      if sanitized then n, reps = 2 ^ 16, 3 end -- memory checks only: past 2^32 takes minutes there
      local host = ur.tensor({ n }, { placement = "pinned" })
      local yp = ffi.cast("float *", C.ur_tensor_data(host.p))
      local pos = 0
      for i = 0, n - 1 do
        local v = (i * 2654435761) % 4096 < 1024 and 1 or 0
        yp[i] = v
        pos = pos + v
      end
      local y = host:to("device")
      local p = ur.tensor({ n }, { placement = "device" }):uniform(0, 1, 5)
      local m = metrics.MetricCollection { metrics = { "auc", "ctr" }, batch_size = n, window_size = 1024,
                                           lifetime_bins = 65536, placement = "device" }
      local one = metrics.AUC { batch_size = n, window_size = 0, lifetime_bins = 65536, placement = "device" }
      assert(one:update { p, y })
      for _ = 1, reps do assert(m:update { p, y }) end
      local v, o = assert(m:values()).default.lifetime, assert(one:values()).default.lifetime
      assert.is_true(sanitized or reps * n > 2 ^ 32)
      assert.equal(reps * n, v.samples)
      assert.equal(reps * n, v.weight)
      assert.equal(reps * pos, v.positive)
      h.near(v.auc, o.auc, 1e-12, "auc is scale-free")
      h.near(v.auc_error, o.auc_error, 1e-12, "bound is scale-free")
    end)

    h.cuda_it("gives the CPU's defined values for empty and one-class windows", function()
      local opts = { metrics = { "auc", "gauc", "ne", "accuracy", "calibration", "ctr" },
                     tasks = { "t" }, batch_size = 64, window_size = 64, include_logloss = true }
      for _, label in ipairs { false, 0, 1 } do
        opts.placement = "host"
        local cpu = metrics.MetricCollection(opts)
        opts.placement = "device"
        local gpu = metrics.MetricCollection(opts)
        if label then
          local b = batch(64, 1, { label = label, weights = "sample" })
          feed(cpu, { b })
          feed(gpu, { b }, "device")
        end
        local a, b = assert(gpu:values()), assert(cpu:values())
        no_nan(a, "gpu " .. tostring(label))
        compare(a, b, 1e-12, "label " .. tostring(label))
        assert.is_nil(a.t.window.auc)
        assert.is_string(a.t.window.auc_undefined)
        local ca, ga = {}, {}
        for k in pairs(assert(cpu:compute())) do ca[#ca + 1] = k end
        for k in pairs(assert(gpu:compute())) do ga[#ga + 1] = k end
        table.sort(ca)
        table.sort(ga)
        assert.same(ca, ga, "compute() leaves out the same undefined keys")
        assert.is_nil(a.t.window.grouped_auc)
      end
    end)

    h.cuda_it("counts bad samples on the device as the CPU does: compute fails naming the task", function()
      refuses_bad_samples("device", "device")
    end)

    h.cuda_it("refuses host-memory inputs for a GPU metric, naming both sides", function()
      local m = metrics.AUC { batch_size = 4, placement = "device" }
      local ok, err = pcall(m.update, m, { ur.tensor { 4 }, ur.tensor { 4 } })
      assert.is_false(ok)
      assert.matches("predictions are in host memory, which the GPU cannot read; the metric's state "
                     .. "is in device memory of cuda:0", err)
    end)
  end)
end)
