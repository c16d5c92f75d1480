-- The uvmrec command meeting a new user's mistakes and a bare machine (issue #26, items 2, 3
-- and 8): each answer is one message that says what is wrong and what to do, with the right
-- exit code, never a traceback, a failure per spec, or files that look valid.
local ur = require "uvmrec"
local cmd = require "command"
local h = require "helpers"

local SAMPLE2 = h.fixture("criteo_raw_sample2.tsv")

describe("the uvmrec command, on mistakes and a bare machine", function()
  local dir
  before_each(function() dir = cmd.tmpdir() end)
  after_each(function() cmd.rmdir(dir) end)

  h.no_gpu_it("says in one line that `uvmrec test --gpu` needs a GPU when there is none", function()
    local out, err, code = cmd.run("test --gpu spec/tensor_spec.lua")
    assert.equal(1, code)
    assert.equal("0 passed, 1 failed, 0 skipped\n", out)
    assert.matches("^the GPU specs need a GPU, and none is in use: [^\n]+\n$", err)
  end)

  it("names a spec path of `uvmrec test` that does not exist, ending with the summary line", function()
    local out, err, code = cmd.run("test spec/no_such_spec.lua")
    assert.equal(1, code, err)
    assert.matches("\nERROR: %?\n  at %?\n  Cannot find file or directory: spec/no_such_spec%.lua\n", out)
    assert.matches("\n0 passed, %d+ failed, 0 skipped\n$", out)
  end)

  it("says before measuring, with the usage (exit 2), that calibrate's --out has no folder to go in", function()
    local out, err, code = cmd.run("calibrate --quick --out /nonexistent/calib.json")
    assert.equal(2, code, out)
    assert.equal("", out)
    assert.matches("^uvmrec calibrate: %-%-out: '/nonexistent/calib%.json': /nonexistent: No such file or directory\n"
      .. "usage: uvmrec calibrate ", err)
  end)

  h.no_gpu_it("says there is no NVIDIA driver, not that the driver is insufficient", function()
    if not ur.cuda_built() then pending("no CUDA backend built: " .. ur.cuda_error()) return end
    local probe = require("ffi").load
    if pcall(probe, "libcuda.so.1") then pending("an NVIDIA driver is installed") return end
    local out, err, code = cmd.run("--version")
    assert.equal(0, code, err)
    assert.matches("\nGPU: no GPU %(no NVIDIA driver: libcuda%.so%.1 cannot be loaded %(", out)
    assert.is_nil(out:find("insufficient", 1, true), out)
  end)

  it("names UVMREC_ROOT when a copy of the program outside a tree is asked for a command", function()
    local copy = dir .. "/bin/uvmrec"
    assert.equal(0, select(3, cmd.sh(("mkdir -p %s/bin %s/lib && cp %s %s"):format(dir, dir, cmd.quote(cmd.bin()),
      cmd.quote(copy)))))
    -- a dist tree's program takes the engine from ../lib (its run path): the libraries go along,
    -- not the tree's Lua modules
    local lib = cmd.bin():match("^(.*)/bin/[^/]*$") .. "/lib"
    if cmd.exists(lib .. "/libuvmrec.so") then
      assert.equal(0, select(3, cmd.sh(("cp %s/*.so* %s/lib/"):format(cmd.quote(lib), dir))))
    end
    local out, err, code = cmd.sh("cd / && env -u UVMREC_ROOT " .. cmd.quote(copy) .. " train dlrm_tiny")
    assert.equal(1, code, out)
    assert.equal("uvmrec: 'train' is a command of a uvmrec tree, and no tree was found beside this program ("
      .. copy .. "); set UVMREC_ROOT to a checkout, a dist tree or an install prefix\n", err)
  end)

  it("refuses a demo too small to hold a page of hot rows, without a traceback", function()
    local out, err, code = cmd.run("demo 10")
    assert.equal(2, code, out)
    assert.matches("^uvmrec demo: ROWS: 10 rows; at least 40, so that the hot 20%% fill a page\nusage: ", err)
    assert.is_nil(err:find("traceback", 1, true))
  end)

  it("reports a negative number given to an option as that option's bad value", function()
    local _, err, code = cmd.run("train dlrm_tiny --steps -5")
    assert.equal(2, code)
    assert.matches("^uvmrec train: %-%-steps: '%-5' is not a whole number %(0, 1, 2, %.%.%.%)\n", err)
    _, err, code = cmd.run("convert x.tsv --out " .. cmd.quote(dir .. "/o") .. " --rows -5")
    assert.equal(2, code)
    assert.matches("^uvmrec convert: %-%-rows: size 1 is %-5; table sizes are whole numbers from 1 to 2%^32\n", err)
    _, err, code = cmd.run("convert x.tsv --out " .. cmd.quote(dir .. "/o") .. " --rows 1.5")
    assert.equal(2, code)
    assert.matches("^uvmrec convert: %-%-rows: size 1 is 1%.5; table sizes are whole numbers from 1 to 2%^32\n", err)
    assert.is_false(cmd.exists(dir .. "/o"))
  end)

  it("converts all or nothing: a missing input or a bad line leaves no folder and no day file", function()
    local out = dir .. "/days"
    local _, err, code = cmd.run("convert " .. cmd.quote(dir .. "/missing.tsv") .. " --out " .. cmd.quote(out))
    assert.equal(1, code)
    assert.equal("uvmrec convert: " .. dir .. "/missing.tsv: No such file or directory\n", err)
    assert.is_false(cmd.exists(out))
    -- the second input's line 300 has a label of 2: day 0 was complete, yet nothing appears
    local l = cmd.lines(SAMPLE2, 400)
    l[300] = "2" .. l[300]:sub(2)
    local good = cmd.spit(dir .. "/day_0.tsv", table.concat(l, "\n", 1, 200) .. "\n")
    local bad = cmd.spit(dir .. "/day_1.tsv", table.concat(l, "\n", 201, 400) .. "\n")
    local both = cmd.quote(good) .. " " .. cmd.quote(bad)
    _, err, code = cmd.run(("convert %s --out %s --rows 1000"):format(both, cmd.quote(out)))
    assert.equal(1, code)
    assert.equal("uvmrec convert: criteo-tsv: " .. bad .. ":100: label is '2'; expected 0 or 1 (--on-bad-line skip "
      .. "skips bad lines and counts them)\n", err)
    assert.is_false(cmd.exists(out))
    -- into a folder that exists: it stays, empty
    os.execute("mkdir -p " .. cmd.quote(out))
    _, _, code = cmd.run(("convert %s --out %s --rows 1000"):format(both, cmd.quote(out)))
    assert.equal(1, code)
    assert.same({}, assert(require("uvmrec.lib").dir_list(out, "", "")))
    -- and with --on-bad-line skip every day is written
    local text
    text, err, code = cmd.run(("convert %s --out %s --rows 1000 --on-bad-line skip"):format(both, cmd.quote(out)))
    assert.equal(0, code, err)
    assert.matches("399 rows, 1 skipped", text)
    assert.same({ "README.txt", "day_0_dense.npy", "day_0_labels.npy", "day_0_sparse.npy", "day_0_sparse_rows.npy",
                  "day_1_dense.npy", "day_1_labels.npy", "day_1_sparse.npy", "day_1_sparse_rows.npy" },
                assert(require("uvmrec.lib").dir_list(out, "", "")))
  end)

  it("converts nothing onto a full disk: the write fails, and no day file or temporary file stays", function()
    -- a full disk, emulated by a 16 KiB file-size limit (SIGXFSZ ignored, so the write fails)
    local out = dir .. "/days"
    os.execute("mkdir -p " .. cmd.quote(out))
    local _, err, code = cmd.sh(("ulimit -f 16; trap '' XFSZ; %s convert %s --out %s --rows 1000"):format(
      cmd.quote(cmd.bin()), cmd.quote(SAMPLE2), cmd.quote(out)))
    assert.equal(1, code)
    assert.matches("^uvmrec convert: npy: [^\n]*day_0_dense%.npy%.tmp%-[%w]+: write failed: File too large\n$", err)
    assert.same({}, assert(require("uvmrec.lib").dir_list(out, "", "")))
  end)
end)

describe("uvmrec.data convert, when it fails", function()
  it("leaves no day file and no temporary file behind, and replaces old days only when it succeeds", function()
    local dir = cmd.tmpdir()
    local l = cmd.lines(SAMPLE2, 400)
    local bad = {}
    for i = 1, 400 do bad[i] = l[i] end
    bad[399] = bad[399]:gsub("\t[^\t]*$", "\tnothex!")
    local data = ur.data
    os.execute("mkdir -p " .. cmd.quote(dir .. "/out"))
    local old = assert(data.convert({ cmd.spit(dir .. "/a.tsv", table.concat(l, "\n", 1, 10) .. "\n") }, dir .. "/out"))
    assert.equal(10, old.rows)
    local _, err = data.convert({ cmd.spit(dir .. "/b.tsv", table.concat(bad, "\n") .. "\n") }, dir .. "/out")
    assert.equal("criteo-tsv: " .. dir .. "/b.tsv:399: field C26 is 'nothex!': not hexadecimal", err)
    -- the day of the earlier conversion is intact: 10 rows, no temporary file beside it
    assert.same({ 10, 13 }, assert(data.npy_load(dir .. "/out/day_0_dense.npy")):size())
    assert.same({ "day_0_dense.npy", "day_0_labels.npy", "day_0_sparse.npy" },
      assert(require("uvmrec.lib").dir_list(dir .. "/out", "", "")))
    assert(data.convert({ dir .. "/a.tsv", cmd.spit(dir .. "/c.tsv", table.concat(l, "\n", 11, 30) .. "\n") },
      dir .. "/out"))
    assert.same({ 20, 13 }, assert(data.npy_load(dir .. "/out/day_1_dense.npy")):size())
    cmd.rmdir(dir)
  end)
end)
