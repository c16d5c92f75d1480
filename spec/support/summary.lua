-- busted output handler: a dot per test, details of each failure, then the one closing line
-- `N passed, N failed, N skipped` that CI reads (errors count as failed, pending as skipped).
return function(options)
  local busted = require "busted"
  local handler = require "busted.outputHandlers.base"()
  local verbose = options.verbose or os.getenv("SPEC_VERBOSE")

  local function where(t)
    -- An error outside any spec (a path given that does not exist) has no place in a file.
    local tr = t.element and t.element.trace
    return tr and tr.short_src and (tr.short_src .. ":" .. tostring(tr.currentline)) or "?"
  end

  local function describe(kind, t)
    local msg = t.message
    if type(msg) ~= "string" then msg = require("pl.pretty").write(msg) end
    io.write(("\n%s: %s\n  at %s\n  %s\n"):format(kind, (t.name or "") ~= "" and t.name or "?", where(t),
      tostring(msg):gsub("\n", "\n  ")))
    if verbose and t.trace and t.trace.traceback then io.write(t.trace.traceback, "\n") end
  end

  handler.testEnd = function(element, _, status)
    if verbose then
      io.write(("%-7s %s\n"):format(status, handler.getFullName(element)))
    else
      io.write(({ success = ".", failure = "F", error = "E", pending = "-" })[status] or "?")
    end
    io.flush()
    return nil, true
  end

  handler.suiteEnd = function()
    io.write("\n")
    for _, t in ipairs(handler.failures) do describe("FAILED", t) end
    for _, t in ipairs(handler.errors) do describe("ERROR", t) end
    if verbose then
      for _, t in ipairs(handler.pendings) do
        io.write(("skipped: %s (%s)\n"):format(t.name, tostring(t.message)))
      end
    end
    io.write(("%d passed, %d failed, %d skipped\n"):format(#handler.successes,
      #handler.failures + #handler.errors, #handler.pendings))
    io.flush()
    return nil, true
  end

  busted.subscribe({ "test", "end" }, handler.testEnd, { predicate = handler.cancelOnPending })
  busted.subscribe({ "suite", "end" }, handler.suiteEnd)
  return handler
end
