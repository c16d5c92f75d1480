-- The C API with NULL pointers (issue #26, item 5): every function of uvmrec.h's UR_CDEF block
-- that returns ur_status refuses a NULL handle or pointer with UR_STATUS_INVALID and a message
-- naming the function and the argument, the functions returning a value (a count, a dim, a
-- name, a handle) answer NULL, -1, 0 or the enum's _COUNT with that message, and the functions
-- returning nothing do nothing with NULL.  The calls are made from C by $(BUILD)/bin/capi_nulls,
-- which make generates from the header (spec/support/capi.lua): a function added to the header
-- is called too.
local capi = require "capi"
local command = require "command"

local HEADERS = { "engine/include/uvmrec.h", "engine/include/uvmrec_lua.h" }

local function program()
  local bin = command.bin()
  local dir = bin:match("^(.*)/[^/]*$") or "."
  local p = dir .. "/capi_nulls"
  return command.exists(p) and p or nil, p
end

describe("the C API given NULL pointers", function()
  local have_tree = command.exists(HEADERS[1])
  local funcs = have_tree and capi.from_headers(HEADERS) or {}
  local results, listed, why

  setup(function()
    if not have_tree then why = "not in a source tree" return end
    local p, where = program()
    if not p then why = where .. " is not built (make test builds it)" return end
    local out, err, code = command.sh(command.quote(p))
    results = {}
    for line in out:gmatch("[^\n]+") do -- "ok FN ARG" or "FAIL FN ARG: why"
      local verdict, fn, a = line:match("^(%a+) (%S+) ([^%s:]+)")
      if fn then
        results[fn] = results[fn] or {}
        results[fn][a] = verdict == "ok" or line
      end
    end
    results["?"] = { code = code, err = err }
    listed = command.sh(command.quote(p) .. " --list")
  end)

  it("is made from the header's prototypes as they are now (capi_nulls lists every function)", function()
    if why then pending(why) return end
    local names = {}
    for _, f in ipairs(funcs) do names[#names + 1] = f.name end
    assert.are.equal(table.concat(names, "\n") .. "\n", listed,
      "capi_nulls was made from another header: run make")
    assert.is_true(#names > 250, "the header's functions were read")
  end)

  it("reads every parameter of every prototype, and knows which may be NULL", function()
    if not have_tree then pending("not in a source tree") return end
    local by = {}
    for _, f in ipairs(funcs) do by[f.name] = f end
    -- A few whose parameters are known, as a check of the reader itself.
    assert.are.same({ "out", "shape" }, capi.required(by.ur_tensor_new))
    assert.are.same({ "src", "dst" }, capi.required(by.ur_tensor_copy)) -- the stream may be NULL
    assert.are.same({ "logits", "targets", "glogits" }, capi.required(by.ur_bce_backward)) -- weights: or NULL
    assert.are.equal("status", capi.kind(by.ur_tensor_fill))
    assert.are.equal("void", capi.kind(by.ur_tensor_free))
    assert.are.equal("value", capi.kind(by.ur_tensor_ndim))
    assert.are.equal("-1", capi.none(by.ur_tensor_ndim))
    assert.are.equal("NULL", capi.none(by.ur_mc_reassigned))
    assert.are.same({ "m", "count" }, capi.required(by.ur_mc_reassigned)) -- an out pointer too
    assert.is_nil(capi.kind(by.ur_dtype_name)) -- takes no pointer
  end)

  for _, f in ipairs(funcs) do
    local kind = capi.kind(f)
    if kind == "status" or kind == "value" then
      local req = capi.required(f)
      it(("%s refuses a NULL %s with %s and a message naming it"):format(f.name,
        table.concat(req, ", a NULL "), kind == "status" and "UR_STATUS_INVALID" or capi.none(f)), function()
        if why then pending(why) return end
        local got = results[f.name] or {}
        for _, a in ipairs(req) do
          if got[a] ~= true then
            error(got[a] or ("capi_nulls made no call of %s with %s NULL (exit code %s; stderr: %s)"):format(
              f.name, a, tostring(results["?"].code), results["?"].err), 0)
          end
        end
      end)
    elseif kind == "void" then
      it(("%s does nothing when given NULL"):format(f.name), function()
        if why then pending(why) return end
        local got = results[f.name] or {}
        if got.NULL ~= true then
          error(got.NULL or ("capi_nulls made no call of %s (exit code %s; stderr: %s)"):format(f.name,
            tostring(results["?"].code), results["?"].err), 0)
        end
      end)
    end
  end
end)
