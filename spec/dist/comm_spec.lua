-- uvmrec.dist's communicators (engine/src/dist/, uvmrec.h section 9) and `uvmrec launch`: every
-- collective over 1 to 4 ranks against a reference (spec/support/dist_collectives.lua, run as
-- each rank), the engines a job gets, NCCL found without a GPU, and each documented error.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local command = require "command"

local function launch(args)
  return command.sh(command.bin() .. " launch " .. args)
end

local h = require "helpers"

describe("uvmrec.dist communicators", function()
  it("runs every collective in a world of one: copies, with statistics", function()
    local out, err, code = command.sh(command.bin() .. " spec/support/dist_collectives.lua")
    assert.equal(0, code, err)
    assert.matches("rank 0: ok %(communicator rank 0 of 1 %(host self, device none%); 26 calls, 0 bytes", out)
  end)

  for _, w in ipairs { 2, 3, 4 } do
    h.mpi_it(("runs every collective over %d ranks through MPI, against the reference"):format(w), function()
      local out, err, code = launch(("-n %d spec/support/dist_collectives.lua"):format(w))
      assert.equal(0, code, out .. err)
      for r = 0, w - 1 do
        local prefix = r == 0 and "" or ("%[rank " .. r .. "%] ")
        assert.matches("\n?" .. prefix .. "rank " .. r .. ": ok %(communicator rank " .. r .. " of " .. w
                       .. " %(host mpi, device none%); 26 calls", out)
      end
      assert.is_nil(out:match("\nrank [1-9]"), "only rank 0's lines go unprefixed")
    end)
  end

  h.mpi_it("names the ranks whose collectives disagree under UVMREC_COMM_CHECK=1, and says so when MPI crashes",
     function()
    local dir = command.tmpdir()
    -- every rank finds each disagreement (all_gather's and all_to_all's counts disagree for every
    -- receiving rank), so each is caught and the next tried; nothing reaches MPI
    local script = command.spit(dir .. "/disagree.lua", [[
      local ur = require "uvmrec"
      local dist = require "uvmrec.dist"
      local comm = assert(dist.init { cpu = true })
      local r, w = dist.rank(), dist.world()
      local function try(f)
        local ok, err = pcall(f)
        print(ok and "no error" or err)
      end
      try(function() assert(comm:all_reduce(ur.tensor({ 10 * (r + 1) }))) end)
      try(function() assert(comm:all_reduce(ur.tensor({ 4 }, { dtype = r == 0 and "f32" or "f64" }))) end)
      try(function() assert(comm:all_reduce(ur.tensor({ 4 }), r == 0 and "sum" or "max")) end)
      try(function() assert(comm:reduce_scatter(ur.tensor({ w * (r + 1) }), ur.tensor({ r + 1 }))) end)
      try(function() assert(comm:broadcast(ur.tensor({ 3 }), r)) end)
      try(function()
        if r == 0 then assert(comm:barrier() and comm:all_reduce(ur.tensor({ 3 })))
        else assert(comm:barrier() and comm:broadcast(ur.tensor({ 3 }))) end
      end)
      local counts = {}
      for q = 1, w do counts[q] = q - 1 == r and r + 2 or 9 end
      local total = 0
      for q = 1, w do total = total + counts[q] end
      try(function() assert(comm:all_gather(ur.tensor({ r + 2 }), ur.tensor({ total }), counts)) end)
      local send, recv = {}, {}
      for q = 1, w do send[q], recv[q] = 1, q - 1 == r and 1 or 2 end
      try(function() assert(comm:all_to_all(ur.tensor({ w }), ur.tensor({ 2 * w - 1 }), send, recv)) end)
      -- inside a group, as the sharded exchange posts its all-to-alls (NCCL's are checked so too)
      local same = {}
      for q = 1, w do same[q] = 1 end
      comm:group_start()
      try(function() assert(comm:all_to_all(ur.tensor({ w }), ur.tensor({ w }), same, same)) end)
      try(function() assert(comm:all_to_all(ur.tensor({ w }), ur.tensor({ 2 * w - 1 }), send, recv)) end)
      comm:group_end()
      assert(comm:wait())
      -- agreeing again, the communicator works
      local t = ur.tensor({ 2 }):fill(1)
      assert(comm:all_reduce(t))
      assert(comm:wait())
      -- one rank's line after the other's: under mpirun the ranks' outputs reach it by pipes of
      -- their own, and once (a fresh-clone CI, 2026-12-07) rank 0's "sum" line landed inside
      -- rank 1's ("[rank 1] sumsum\t2\n\t2")
      if r == 0 then
        print("sum", t[0])
        io.stdout:flush()
      end
      assert(comm:barrier())
      assert(comm:wait())
      if r == 1 then print("sum", t[0]) end
    ]])
    local out, err, code = command.sh(("UVMREC_COMM_CHECK=1 %s launch -n 2 %s"):format(command.bin(), script))
    assert.equal(0, code, out .. err)
    for _, want in ipairs {
      "comm all_reduce: rank 0 gives 10 elements and rank 1 20; every rank gives as many",
      "comm all_reduce: rank 0 gives f32 and rank 1 f64; expected one dtype",
      "comm all_reduce: rank 0 reduces by sum and rank 1 by max; expected one reduction",
      "comm reduce_scatter: rank 0 gives 1 elements per rank and rank 1 2; every rank gives as many",
      "comm broadcast: rank 0 takes root 0 and rank 1 1; expected one root",
      "comm all_reduce: rank 0 calls all_reduce and rank 1 broadcast; every rank makes the same collectives in "
        .. "the same order",
      "comm all_gather: rank 1 gives 3 elements, and rank 0's counts[1] is 9",
      "[rank 1] comm all_gather: rank 0 gives 2 elements, and rank 1's counts[0] is 9",
      "comm all_to_all: rank 1 sends rank 0 1 elements, and rank 0's recv_counts[1] is 2",
    } do
      assert.is_truthy(out:find(want, 1, true), want .. "\n" .. out)
    end
    local _, twice = out:gsub("\ncomm all_to_all: rank 1 sends rank 0 1 elements, and rank 0's recv_counts%[1%] is 2",
      "")
    assert.equal(2, twice, "the grouped all_to_all is checked too:\n" .. out)
    assert.matches("\nno error\n", out, 1, true)
    assert.matches("\nsum\t2", "\n" .. out)
    assert.matches("%[rank 1%] sum\t2", out)
    -- without the check, MPI takes the disagreeing sizes and crashes: launch says what finds them
    local mism = command.spit(dir .. "/mism.lua", [[
      local ur = require "uvmrec"
      local dist = require "uvmrec.dist"
      local comm = assert(dist.init { cpu = true })
      local t = ur.tensor({ 100000 * (dist.rank() + 1) }):fill(1)
      assert(comm:all_reduce(t))
      assert(comm:wait())
    ]])
    out, err, code = command.sh(("timeout 120 %s launch -n 2 %s"):format(command.bin(), mism))
    assert.is_true(code ~= 0, out .. err)
    assert.matches("UVMREC_COMM_CHECK=1 makes the ranks compare each host collective's sizes before MPI takes it, "
      .. "naming the ranks that disagree", err)
    out, err, code = command.sh(("UVMREC_COMM_CHECK=1 timeout 120 %s launch -n 2 %s"):format(command.bin(), mism))
    assert.equal(1, code, out .. err)
    assert.matches("uvmrec launch: rank %d exited with 1: .*comm all_reduce: rank 0 gives 100000 elements and rank 1 "
      .. "200000; every rank gives as many; stopping the other ranks", err)
    local _, e2 = command.sh(("UVMREC_COMM_CHECK=yes %s launch -n 2 %s"):format(command.bin(), mism))
    assert.matches("comm: UVMREC_COMM_CHECK is 'yes'; expected 0 or 1", e2)
    command.rmdir(dir)
  end)

  -- NCCL's collectives: their kind, dtype, counts, reduction and root are host values, compared
  -- over the job's MPI communicator by the same check as MPI's (above) before NCCL takes them
  h.cuda_it("names the ranks whose NCCL collectives disagree under UVMREC_COMM_CHECK=1", { gpus = 2, mpi = true },
            function()
    local dir = command.tmpdir()
    local script = command.spit(dir .. "/nccl.lua", [[
      local ur = require "uvmrec"
      local dist = require "uvmrec.dist"
      local comm = assert(dist.init())
      local r = dist.rank()
      local function try(f)
        local ok, err = pcall(f)
        print(ok and "no error" or err)
      end
      local dev = { placement = "device", device = comm.device }
      try(function() assert(comm:all_reduce(ur.tensor({ 10 * (r + 1) }, dev))) end)
      try(function() assert(comm:broadcast(ur.tensor({ 3 }, dev), r)) end)
      local send, recv = { 1, 1 }, { 1, 1 }
      recv[2 - r] = 2
      comm:group_start()
      try(function() assert(comm:all_to_all(ur.tensor({ 2 }, dev), ur.tensor({ 3 }, dev), send, recv)) end)
      comm:group_end()
      local t = ur.tensor({ 2 }, dev):fill(1)
      assert(comm:all_reduce(t))
      assert(comm:wait())
      print("sum", t:to("host")[0])
    ]])
    local out, err, code = command.sh(("UVMREC_COMM_CHECK=1 timeout 300 %s launch -n 2 %s"):format(command.bin(),
      script))
    assert.equal(0, code, out .. err)
    for _, want in ipairs {
      "comm all_reduce: rank 0 gives 10 elements and rank 1 20; every rank gives as many",
      "comm broadcast: rank 0 takes root 0 and rank 1 1; expected one root",
      "comm all_to_all: rank 1 sends rank 0 1 elements, and rank 0's recv_counts[1] is 2",
    } do
      assert.is_truthy(out:find(want, 1, true), want .. "\n" .. out)
    end
    assert.matches("\nsum\t2", "\n" .. out)
    -- ranks forked without MPI have nothing to compare over: refused, not left unchecked
    out, err, code = command.sh(("UVMREC_COMM_CHECK=1 timeout 300 %s launch -n 2 --fork %s"):format(command.bin(),
      script))
    assert.is_true(code ~= 0, out .. err)
    assert.matches("comm: UVMREC_COMM_CHECK=1 compares each collective over MPI, and rank %d of 2 was not started "
      .. "by mpirun", err)
    command.rmdir(dir)
  end)

  h.cuda_it("refuses more ranks on a host than it has GPUs, naming the rank", function()
    -- rank r took GPU r mod the GPUs, so two ranks shared one and NCCL's setup failed naming neither
    local n = ur.devices() + 1
    local script = command.spit(os.tmpname(), 'assert(require("uvmrec.dist").init())')
    local out, err, code = launch(("-n %d --fork %s"):format(n, script))
    os.remove(script)
    assert.is_true(code ~= 0, out .. err)
    assert.matches(("dist: rank %d is rank %d of its host, which has %d GPUs?: one rank per GPU"):format(n - 1, n - 1,
      n - 1), err)
  end)

  h.mpi_it("joins a job started by a plain mpirun, ranks from MPI's environment", function()
    local root = command.sh("id -u") == "0\n" and "--allow-run-as-root " or ""
    local out, err, code = command.sh(("mpirun %s--oversubscribe -np 3 %s spec/support/dist_collectives.lua")
      :format(root, command.bin()))
    assert.equal(0, code, out .. err)
    assert.matches("rank 0: ok %(communicator rank 0 of 3 %(host mpi", out)
    assert.matches("%[rank 2%] rank 2: ok %(communicator rank 2 of 3 %(host mpi", out)
  end)

  it("opens NCCL without a GPU, or names every file it tried", function()
    local n, why = dist.nccl()
    if n then
      assert.is_true(n.version >= 20700, "NCCL 2.7 or later: " .. n.version)
      assert.matches("libnccl%.so", n.path)
    else
      assert.matches("NCCL %(libnccl%.so%.2%) not found; tried .*UVMREC_NCCL", why)
    end
    local old = os.getenv("UVMREC_NCCL")
    -- a named file that is not there is reported as such (the process opens NCCL once, so in a child)
    local out, err, code = command.sh("UVMREC_NCCL=/nonexistent/libnccl.so.2 " .. command.bin()
      .. " -e 'local d = require \"uvmrec.dist\"; local n, e = d.nccl(); print(n, e)'")
    assert.equal(0, code, err)
    assert.matches("nil\tcomm: NCCL %(libnccl%.so%.2%) not found; tried /nonexistent/libnccl%.so%.2", out)
    assert.equal(old, os.getenv("UVMREC_NCCL"))
  end)

  it("opens the MPI plugin without starting MPI", function()
    local m, why = dist.mpi()
    if not m then
      assert.matches("libuvmrec_mpi%.so did not load .* openmpi%-bin, libopenmpi%-dev", why)
      return
    end
    assert.matches("MPI", m.library)
    assert.matches("libuvmrec_mpi%.so$", m.path)
  end)

  it("reads the job from the environment", function()
    local out, err, code = command.sh("UVMREC_WORLD=3 UVMREC_RANK=2 " .. command.bin()
      .. " -e 'local e = require(\"uvmrec.dist\").environment(); print(e.rank, e.world, e.launcher)'")
    assert.equal(0, code, err)
    assert.equal("2\t3\tuvmrec\n", out:gsub("^%[rank 2%] ", ""))
    local e = dist.environment()
    assert.same({ 0, 1 }, { e.rank, e.world })
  end)

  describe("errors", function()
    local comm = assert(dist.comm())
    local a, b = ur.tensor({ 4 }), ur.tensor({ 3 })

    it("names sizes, counts, roots and reductions that do not fit", function()
      assert.has_error(function() comm:all_reduce(a, b) end,
        "comm all_reduce: the input has 4 elements and the output 3; expected as many")
      assert.has_error(function() comm:reduce_scatter(a, b) end,
        "comm reduce_scatter: the input has 4 elements; expected 1 blocks of the output's 3")
      assert.has_error(function() comm:all_to_all(a, b, { 4 }, { 3 }) end,
        "comm all_to_all: rank 0 sends itself 4 elements and receives 3 from itself")
      assert.has_error(function() comm:all_to_all(a, ur.tensor({ 4 }), { 5 }, { 4 }) end,
        "comm all_to_all: send_counts sum to 5, and the input has 4 elements")
      assert.has_error(function() comm:all_to_all(a, b, { 4, 1 }, { 3 }) end,
        "comm: send_counts must list 1 counts, one per rank")
      -- a count was cast: 4.5 taken as 4, 'x' a raw FFI error
      local c = ur.tensor({ 4 }):fill(0)
      assert.has_error(function() comm:all_to_all(a, c, { 4.5 }, { 4 }) end,
        "comm: send_counts[0] is 4.5; expected a whole number of elements")
      assert.has_error(function() comm:all_to_all(a, c, { 4 }, { "x" }) end,
        "comm: recv_counts[0] is x; expected a whole number of elements")
      assert.has_error(function() comm:all_gather(a, c, { 4.5 }) end,
        "comm: counts[0] is 4.5; expected a whole number of elements")
      -- inf was cast to -2^63 ('send_counts[0] is -9223372036854775808; expected a count >= 0')
      assert.has_error(function() comm:all_to_all(a, c, { math.huge }, { 4 }) end,
        "comm: send_counts[0] is inf; expected a whole number of elements")
      assert.has_error(function() comm:all_gather(a, b, { 4 }) end,
        "comm all_gather: counts sum to 4, and the output has 3 elements")
      assert.has_error(function() comm:broadcast(a, 1) end, "comm broadcast: root 1; expected a rank 0..0")
      assert.has_error(function() comm:all_reduce(a, nil, "mean") end,
        "comm: reduction 'mean' is not sum, max or min")
      assert.has_error(function() comm:all_reduce(a, ur.tensor({ 4 }, { dtype = "i32" })) end,
        "comm all_reduce: the input is f32 and the output i32; expected one dtype")
      assert.has_error(function() comm:all_reduce(ur.tensor({ 2 }, { dtype = "u8" })) end,
        "comm all_reduce: dtype u8 cannot be reduced; expected f32, f64, i32, i64, f16 or bf16")
      assert.has_error(function() comm:all_reduce("x") end, "comm: input must be a tensor, got string")
      assert.has_error(function() comm:group_end() end, "comm group_end: no group_start before it")
    end)

    it("refuses a job on the CPU without MPI, naming the package", function()
      local out, err, code = launch("-n 2 --fork train dlrm_tiny --cpu")
      assert.equal(1, code, out)
      assert.matches("uvmrec launch: 2 ranks on the CPU need MPI for their collectives, and %-%-fork starts "
        .. "the ranks without it: install OpenMPI %(Debian: apt%-get install openmpi%-bin libopenmpi%-dev", err)
      -- ranks started without MPI and without a GPU cannot make a communicator
      local script = command.spit(os.tmpname(), 'assert(require("uvmrec.dist").init{cpu = true})')
      out, err, code = launch("-n 2 --fork " .. script)
      os.remove(script)
      assert.is_true(code ~= 0, out)
      assert.matches("comm: rank %d of 2 has neither MPI %(the job was not started by mpirun%) nor a GPU", err)
      assert.matches("uvmrec launch: rank %d exited with 1: .*comm: rank %d of 2 has neither MPI .*; stopping the "
        .. "other ranks", err)
    end)

    it("says what launch needs", function()
      local _, err, code = launch("")
      assert.equal(2, code)
      assert.matches("uvmrec launch: ", err)
      _, err, code = launch("-n 0 train") -- a bad option's value: exit 2, as command.md says
      assert.equal(2, code)
      assert.matches("^uvmrec launch: %-n: '0' is less than 1\nusage: uvmrec launch ", err)
    end)
  end)
end)
