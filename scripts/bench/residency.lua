-- How `residency` tells a managed range in HBM from one on the host, by size (needs a GPU): a
-- 64 MiB managed tensor advised preferred_location=cpu and accessed_by the GPU, its first SIZE
-- bytes probed after a prefetch to the CPU (read in place over the host link) and after a
-- prefetch to the GPU, REPEAT times each; the table gives the range's GB/s beside the probe's two
-- references (device memory evicted from L2, pinned host memory) and its verdict.
--   uvmrec scripts/bench/residency.lua [--repeat N] [--out FILE]
local cmd = require("uvmrec.cli").command {
  name = "scripts/bench/residency.lua",
  summary = "residency's verdict and its reads (range, device and pinned host references) by size, for a "
    .. "managed range on the host and in HBM (needs a GPU)",
  { "--repeat N", "probes of each size and place", type = "whole", default = 3, min = 1 },
  require("uvmrec.cli").options.out_append,
}
local opt = cmd:parse(arg)
local ur = require "uvmrec"
local json = require "uvmrec.json"
if not ur.gpu() then cmd:fail("needs a GPU: " .. ur.cuda_error(), 2) end

local MiB = 1024 * 1024
local t = assert(ur.uvm_tensor({ 64 * MiB / 4 }, 0))
local n = t:numel()
assert(t:fill(1))
assert(t:advise(0, n, "preferred_location", "cpu"))
assert(t:advise(0, n, "accessed_by", "gpu"))
print(("%-10s %-5s %10s %12s %12s %8s"):format("bytes", "at", "GB/s", "device GB/s", "host GB/s", "where"))
local wrong, unknown = 0, 0
for _, bytes in ipairs { 4096, 65536, MiB, 16 * MiB, 64 * MiB } do
  for _, at in ipairs { "cpu", "gpu" } do
    for _ = 1, opt["repeat"] do
      assert(t:prefetch(0, n, at))
      assert(ur.sync())
      local r = assert(t:residency(0, bytes / 4))
      if r.fast == nil then
        unknown = unknown + 1
      elseif r.fast ~= (at == "gpu") then
        wrong = wrong + 1
      end
      print(("%-10d %-5s %10.2f %12.2f %12.2f %8s"):format(bytes, at, r.gbps, r.device_gbps, r.host_gbps, r.where))
      if opt.out then
        json.append_lines(opt.out, { bench = "residency", bytes = bytes, prefetched_to = at, gbps = r.gbps,
                                     device_gbps = r.device_gbps, host_gbps = r.host_gbps, where = r.where })
      end
    end
  end
end
t:free()
print(("%d probes: %d wrong, %d too small to tell"):format(5 * 2 * opt["repeat"], wrong, unknown))
if wrong > 0 then cmd:fail(("%d verdicts contradict where the range was prefetched"):format(wrong), 1) end
