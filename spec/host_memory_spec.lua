local ur = require "uvmrec"
local cmd = require "command"
local train = require "uvmrec.train"
local host_memory = require "uvmrec.host_memory"

local function config(name, sets)
  return assert(train.config.load(assert(train.find_config(name)), sets or {}))
end

describe("uvmrec.host_memory", function()
  it("counts the tables the host holds: every one on the CPU; on a GPU host, managed and cached ones", function()
    local rows = 0
    for _, r in ipairs(ur.data.presets.mlperf_rows) do rows = rows + r end
    local cfg = config("dlrm_mlperf_v1", { "embeddings.placement=cached" })
    local need = host_memory.count(cfg, nil, true)
    assert.equal(rows * 128 * 4, need.items[1].bytes) -- 89.5 GiB of f32 rows, SGD: no state
    assert.equal(0, need.items[2].bytes)
    assert.equal(0, host_memory.count(config("dlrm_mlperf_v1", { "embeddings.placement=device" }), nil, true).total)
    local adam = config("dlrm_tiny", { "embeddings.optimizer.name=adam" })
    local tiny = 0
    for _, r in ipairs(ur.data.presets.tiny_rows) do tiny = tiny + r end
    local n = host_memory.count(adam, nil, false)
    assert.same({ tiny * 16 * 4, 2 * tiny * 16 * 4 }, { n.items[1].bytes, n.items[2].bytes })
  end)

  it("counts the loader's buffers and the day files' page cache", function()
    local dir = cmd.tmpdir()
    local out, err, code = cmd.run(("datagen tiny --out %s --samples 3000 --days 2"):format(dir))
    assert.equal(0, code, out .. err)
    local files = 0
    for _, name in ipairs { "dense", "sparse", "labels" } do
      for d = 0, 1 do
        local f = assert(io.open(("%s/day_%d_%s.npy"):format(dir, d, name), "rb"))
        files = files + f:seek("end")
        f:close()
      end
    end
    local cfg = config("dlrm_tiny")
    local need = host_memory.count(cfg, { data = "criteo-bin:" .. dir, batch_size = 1024, depth = 3, threads = 2 },
                                   false)
    assert.equal("the day files in the page cache", need.items[4].what)
    assert.equal(files, need.items[4].bytes)
    -- 5 slots (3 ahead, 2 held) of 1024 samples: dense, label, and per table an id, a length and an offset
    assert.equal(5 * (1024 * (13 * 4 + 4 + 8 + 26 * 12 + 26 * 4 + 26 * 8) + 8), need.items[3].bytes)
    -- multi-hot day files: an id slot a column, H of them (a column a table counted 26)
    out, err, code = cmd.run(("datagen tiny_multihot --out %s/multi --samples 500 --cpu"):format(dir))
    assert.equal(0, code, out .. err)
    local f = assert(io.open(dir .. "/multi/day_0_sparse.npy", "rb"))
    local H = assert(ur.data.npy_header(f:read(4096))).shape[2]
    f:close()
    assert.is_true(H > 26, "columns " .. H)
    need = host_memory.count(cfg, { data = "criteo-bin:" .. dir .. "/multi", batch_size = 1024, depth = 3,
                                    threads = 2 }, false)
    assert.equal(5 * (1024 * (13 * 4 + 4 + 8 + H * 12 + 26 * 4 + 26 * 8) + 8), need.items[3].bytes)
    cmd.rmdir(dir)
  end)

  it("refuses an oversize run before allocating anything, with the numbers", function()
    local t0 = cmd.now()
    local out, err, code = cmd.run("train dlrm_mlperf_v1 --host-memory 64GiB --steps 1 --progress none")
    assert.is_not.equal(0, code)
    assert.matches("host memory: the run needs 89%.%d+ GiB %(tables on the host 89%.53 GiB, the loader's buffers "
      .. "[%d.]+ MiB, in all 89%.%d+ GiB%) but 64%.00 GiB are allowed %(%-%-host%-memory%)", out .. err)
    assert.is_true(cmd.now() - t0 < 60) -- 89.5 GiB were never drawn
    local _, lerr = pcall(host_memory.check, { total = 1, items = {} }, "lots")
    assert.matches("host memory: bytes: 'lots' is not a size; expected a number of bytes or e.g. '16GiB'", lerr, 1,
                   true)
    assert.is_true(host_memory.check({ total = 2 ^ 30, items = {} }, "1GiB"))
    -- the command's flag: its one line and usage, before any work, not a traceback
    out, err, code = cmd.run("train dlrm_tiny --host-memory lots --progress none")
    assert.equal(2, code)
    assert.matches("^uvmrec train: %-%-host%-memory: 'lots' is not a size; expected a number of bytes or e%.g%. "
                   .. "'16GiB'\n", err)
    assert.is_nil((out .. err):find("traceback", 1, true))
  end)

  it("reads this process's peak resident memory in bytes, which holds what it touches", function()
    local before = assert(host_memory.peak())
    local rss = tonumber(cmd.slurp("/proc/self/status"):match("\nVmRSS:%s*(%d+) kB")) * 1024
    assert.is_true(before >= rss, ("peak %d below the resident %d"):format(before, rss))
    local big = ("x"):rep(before - rss + 64 * 2 ^ 20) -- past the old peak by 64 MiB
    local after = assert(host_memory.peak())
    assert.is_true(after >= rss + #big, ("peak %d after touching %d bytes over %d resident"):format(after, #big, rss))
    big = nil -- luacheck: ignore 311
    collectgarbage()
  end)

  it("reads this process's resident memory now, which grows by what it touches", function()
    local rss = assert(host_memory.resident())
    assert.is_true(rss <= assert(host_memory.peak()), "resident above the peak")
    local big = ("y"):rep(64 * 2 ^ 20)
    local now = assert(host_memory.resident())
    assert.is_true(now >= rss + #big / 2, ("resident %d after touching %d bytes over %d"):format(now, #big, rss))
    big = nil -- luacheck: ignore 311
    collectgarbage()
  end)

  it("says what the host can still give, no more than its memory and swap, and whether a request fits", function()
    local info = require("uvmrec.lib").read_file("/proc/meminfo")
    if not info then return end
    local avail, where = assert(host_memory.available())
    local total = (tonumber(info:match("MemTotal:%s*(%d+)")) + tonumber(info:match("SwapTotal:%s*(%d+)") or 0)) * 1024
    assert.is_true(avail > 0 and avail <= total, ("available %d of %d"):format(avail, total))
    assert.is_string(where)
    assert.is_true(host_memory.fits(1))
    local ok, err = host_memory.fits(total + 1)
    assert.is_nil(ok)
    assert.matches(("^%d bytes %%(.-%%) but the host has .- available %%(.+%%)$"):format(total + 1), err)
  end)
end)
