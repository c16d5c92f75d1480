-- Run by spec/dist/pipeline_spec.lua as every rank of `uvmrec launch -n W`: two copies of a
-- sharded DLRM (dlrm_tiny, tables `cached` or `managed` by PLACEMENT, sharded by PLAN), one
-- trained through the prefetch pipeline (uvmrec.pipeline.Prefetch over the sharded
-- collection: each batch's input exchange and cache fill run ahead, its ticket goes to
-- forward and backward), the other on the same slices without it.  Every rank checks at every
-- step, before the forward, that the ticket's exchanged ids of each cached shard are all in its
-- cache (the prefetch took the rows) and that the forward and backward prepare nothing more
-- (the cache's batch counter stays); that the two copies' losses are equal bit for bit; with
-- managed shards (PAGES=1) that the pipeline prefetched their pages from the exchanged ids;
-- and that misuse is refused clearly.  Environment: PLAN (a kind, or "mixed": table-wise,
-- row-wise and data-parallel in turn), PLACEMENT, STEPS, PAGES.  Every rank prints "rank R: ok"; rank 0 the losses.
local ur = require "uvmrec"
local dist = require "uvmrec.dist"
local train = require "uvmrec.train"
local Prefetch = require "uvmrec.pipeline.Prefetch"

assert(dist.init { cpu = true })
local rank, world = dist.rank(), dist.world()
local place = os.getenv("PLACEMENT") or "cached"
local steps = tonumber(os.getenv("STEPS") or "4")
local pages = os.getenv("PAGES") == "1"
local sets = { "embeddings.placement=" .. place, "embeddings.optimizer.name=adagrad" }
local cfg = assert(train.config.load(assert(train.find_config("dlrm_tiny")), sets))
local plan = os.getenv("PLAN") or "row_wise"
if plan == "mixed" then
  -- column shards of other widths than the tables' cannot share their rank's cache (refused)
  plan = require("uvmrec.dist.plan").in_turn(#cfg.embeddings.rows, { "table_wise", "row_wise", "data_parallel" })
end
local def = assert(train.model_def(cfg))
local A = assert(def.build(cfg, { cpu = true, sharding = plan }))
local B = assert(def.build(cfg, { cpu = true, sharding = plan }))
local optA, optB = train.optimizer(cfg, A), train.optimizer(cfg, B)
local bs = cfg.train.batch_size
local function loader()
  return assert(ur.data.loader { data = cfg.data.train, samples = steps * bs, batch_size = bs, slice_rank = rank,
                                 slice_world = world })
end
local la, lb = loader(), loader()

local function fail(fmt, ...) error(("rank %d: " .. fmt):format(rank, ...), 0) end
local function refused(pattern, f, ...)
  local ok, err = pcall(f, ...)
  if ok or not tostring(err):find(pattern, 1, true) then
    fail("expected an error with %q, got %s", pattern, ok and "none" or tostring(err))
  end
end

local ebc = A.embeddings
-- this rank's shard collections, each with its shard tables' features and the ticket's part
local kinds = { { ebc.tbe_a2a, ebc.a2a[rank].tables, 1, "a2a" }, { ebc.tbe_rw, ebc.rw.tables, 2, "rw" },
                { ebc.tbe_dp, ebc.dp.tables, 3, "dp" } }

-- every id of the ticket's cached shards is in their caches now, before the forward
local function check_cached(t, step)
  local checked = 0
  for _, k in ipairs(kinds) do
    local c, tables, part = k[1], k[2], t.parts[k[3]]
    if c and c.cache then
      if not t.tickets[k[4]] then fail("step %d: the ticket has no cache ticket for its %s shards", step, k[4]) end
      local values = part:values():totable()
      for _, tab in ipairs(tables) do
        for _, f in ipairs(tab.features) do
          local span = part:key_span(f)
          local ids = {}
          for v = span.values[1] + 1, span.values[2] do ids[#ids + 1] = values[v] end
          local slots = c.cache:contains(tab.name, ids)
          for j, s in ipairs(slots) do
            if not s then
              fail("step %d: shard %s's row %d (feature %s) is not in the cache", step, tab.name, ids[j], f)
            end
          end
          checked = checked + #ids
        end
      end
    end
  end
  return checked
end

local function batches()
  local n = 0
  for _, c in ipairs(ebc.collections) do
    if c.cache then n = n + c.cache:stats().batches end
  end
  return n
end

local p = Prefetch.new { collection = ebc, source = la, steps = steps, pages = pages or nil }
local losses, checked = {}, 0
for step = 1, steps do
  local ba = assert(p:next(), "the pipeline ended early")
  local t = ba.ticket
  if type(t) ~= "table" or not t.ticket then fail("step %d: the pipeline's batch has no ticket", step) end
  if place == "cached" then checked = checked + check_cached(t, step) end
  local before = batches()
  local la_ = train.loop.step(A, optA, ba):totable()[1]
  if batches() ~= before then
    fail("step %d: the forward and backward prepared %d batches more in the caches", step, batches() - before)
  end
  if not t.retired then fail("step %d: the backward left the ticket unretired", step) end
  if step == 1 then
    -- a retired ticket, another input's, a KJT for prefetch_pages: refused before any collective
    refused("was retired already", ebc.forward, ebc, ba.sparse, t)
    refused("prefetch_pages takes a batch's ticket", ebc.prefetch_pages, ebc, ba.sparse)
  end
  local bb = assert(lb:next())
  local lb_ = train.loop.step(B, optB, bb):totable()[1]
  if la_ ~= lb_ then fail("step %d: loss %.9g through the pipeline, %.9g without", step, la_, lb_) end
  losses[#losses + 1] = ("%.9g"):format(la_)
end
if p:next() ~= nil then fail("the pipeline gave more than %d batches", steps) end
local st = p:stats()
if st.prefetched ~= steps or st.batches ~= steps then
  fail("the pipeline prefetched %d and handed out %d batches of %d", st.prefetched, st.batches, steps)
end
if pages then
  if not (st.pages > 0 and st.page_runs > 0) then fail("no managed page prefetched (%d pages)", st.pages or -1) end
end
if place == "cached" then
  local cs = ebc:cache_stats()
  if checked == 0 or cs.batches == 0 then fail("no cached id checked") end
  if rank == 0 then print(("cache: %d ids checked in the cache before their forward; hit rate %.3f"):format(checked,
    cs.hit_rate)) end
  -- pages need managed shards
  refused("pages = true needs a collection with managed tables", Prefetch.new, { collection = ebc, source = la,
                                                                                 pages = true })
end
p:free()
-- a ticket given to another input's forward is refused
local t2 = assert(ebc:prepare(assert(lb:next() or loader():next()).sparse))
refused("prepared for another input", ebc.forward, ebc, (loader():next()).sparse, t2)
assert(ebc:retire(t2, false))
if rank == 0 then
  print("losses " .. table.concat(losses, " "))
  if pages then print(("pages: %d pages, %d runs prefetched"):format(st.pages, st.page_runs)) end
end
print(("rank %d: ok"):format(rank))
