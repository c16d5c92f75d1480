-- Shared spec helpers: GPU guards, random references, tolerant comparison.
local ur = require "uvmrec"

local M = {}

-- An `it` for GPU behaviour, tagged #cuda: without a GPU it shows as pending, never passed;
-- under `make test-gpu` (UVMREC_REQUIRE_GPU=1) a missing GPU fails it instead.
function M.cuda_it(name, fn)
  local env = getfenv(2) -- busted gives each spec file its own environment
  local it = env.it
  it(name .. " #cuda", function(...)
    if not ur.gpu() then
      if os.getenv("UVMREC_REQUIRE_GPU") == "1" then
        error("no GPU in use: " .. ur.cuda_error())
      end
      -- Looked up now: busted resolves `pending` through the context that is running.
      env.pending("no GPU: " .. ur.cuda_error())
      return
    end
    return fn(...)
  end)
end

function M.near(a, b, tol, what)
  if math.abs(a - b) > tol * math.max(1, math.abs(b)) then
    error(("%s: %.9g differs from %.9g by more than %g"):format(what or "value", a, b, tol), 2)
  end
end

-- Placements this machine can hold.
function M.placements()
  local p = { "host", "pinned", "managed" }
  if ur.gpu() then p[#p + 1] = "device" end
  return p
end

M.dtypes = { "f32", "bf16", "f16", "i8", "u8", "i32", "i64" }

return M
