-- The C API as its header declares it, and the program that calls every function of it with
-- NULL pointers (spec/capi_null_spec.lua; make builds it as $(BUILD)/bin/capi_nulls).
--
-- The prototypes come from the UR_CDEF blocks of engine/include/uvmrec.h and uvmrec_lua.h, the
-- ones lua/uvmrec/cdef.lua is made of.  A pointer parameter is required unless it is a stream
-- (NULL is the default stream) or its declaration says `/* or NULL */` after its name.  The
-- program, for each function returning ur_status, calls it once per required pointer with
-- that one NULL, the other required ones pointing at zeroed memory, optional ones NULL and
-- every number 1 (so a count never excuses a NULL array): it must return UR_STATUS_INVALID with
-- "<function>: argument '<name>' is NULL" in ur_last_error(), before it reads anything else.
-- Functions returning nothing are called with every pointer NULL and must return.  Functions
-- returning a value (a count, a dim, a name, a handle) are called as those returning ur_status
-- are, once per required pointer, and must return M.none(f) (uvmrec.h's rule: NULL, -1, 0 or
-- the enum's _COUNT) with the same message.  Each call runs in a child process, so one crash
-- does not hide the others.
--
--   luajit spec/support/capi.lua engine/include/uvmrec.h engine/include/uvmrec_lua.h > capi_nulls.c
local M = {}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- The text between /* UR_CDEF_BEGIN */ and /* UR_CDEF_END */.
function M.block(text)
  local b = text:match("/%* UR_CDEF_BEGIN %*/\n(.-)\n/%* UR_CDEF_END %*/")
  return assert(b, "no UR_CDEF block")
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- Splits a parameter list at its top-level commas (not those in comments).
local function split_params(s)
  s = s:gsub("/%*.-%*/", function(c) return (c:gsub(",", "\1")) end)
  local out, depth, cur = {}, 0, {}
  for c in s:gmatch(".") do
    if c == "(" then depth = depth + 1 elseif c == ")" then depth = depth - 1 end
    if c == "," and depth == 0 then
      out[#out + 1] = table.concat(cur)
      cur = {}
    else
      cur[#cur + 1] = c
    end
  end
  out[#out + 1] = table.concat(cur)
  for i, p in ipairs(out) do out[i] = p:gsub("\1", ",") end
  return out
end

local function param(text)
  local notes = {}
  for n in text:gmatch("/%*%s*(.-)%s*%*/") do notes[#notes + 1] = n end
  local bare = trim(text:gsub("/%*.-%*/", " "))
  local ty, name = bare:match("^(.-[%s%*])([%w_]+)$")
  assert(ty, "cannot read the parameter '" .. text .. "'")
  ty = trim(ty)
  local p = { type = ty, name = name, pointer = ty:find("*", 1, true) ~= nil }
  for _, n in ipairs(notes) do
    if n:find("or NULL", 1, true) then p.optional = true end
  end
  -- NULL is the default stream wherever a stream is taken.
  if ty:match("^ur_stream%s*%*$") or ty:match("^const ur_stream%s*%*$") then p.optional = true end
  return p
end

-- Every UR_API prototype of the text: {name, ret, params = {{type, name, pointer, optional}}},
-- in the header's order.
function M.functions(text)
  local out = {}
  local code = text:gsub("\n", " ")
  for decl in code:gmatch("UR_API%s+([^;]-%b());") do
    local ret, name, params = decl:match("^(.-)([%w_]+)%s*(%b())$")
    assert(name, "cannot read the declaration '" .. decl .. "'")
    params = trim(params:sub(2, -2))
    local f = { name = name, ret = trim(ret:gsub("/%*.-%*/", "")), params = {} }
    if params ~= "void" and params ~= "" then
      for _, t in ipairs(split_params(params)) do f.params[#f.params + 1] = param(t) end
    end
    out[#out + 1] = f
  end
  return out
end

-- The functions of the headers' UR_CDEF blocks.
function M.from_headers(paths)
  local all = {}
  for _, p in ipairs(paths) do
    for _, f in ipairs(M.functions(M.block(read(p)))) do all[#all + 1] = f end
  end
  return all
end

function M.required(f)
  local out = {}
  for _, p in ipairs(f.params) do
    if p.pointer and not p.optional then out[#out + 1] = p.name end
  end
  return out
end

-- What the program checks of f: "status" (a call per required pointer), "void" (one call with
-- every pointer NULL), "value" (a call per required pointer, the answer M.none(f)), or nil (it
-- takes no pointer and is not called).
function M.kind(f)
  if f.ret == "ur_status" then return #M.required(f) > 0 and "status" or nil end
  if f.ret == "void" then
    for _, p in ipairs(f.params) do
      if p.pointer then return "void" end
    end
    return nil
  end
  return #M.required(f) > 0 and "value" or nil
end

-- What a value-returning function answers for a NULL pointer, as uvmrec.h's opening comment
-- states it: a C expression its answer must equal ("isnan" for a double: NaN).
local NONE = { int32_t = "-1", int64_t = "-1", size_t = "0", uint32_t = "0", uint64_t = "0", double = "isnan",
               ur_dtype = "UR_DTYPE_COUNT", ur_place = "UR_PLACE_COUNT" }
-- ur_json's readers answer as for a value of another type ("0 unless an integer").
local NONE_OF = { ur_json_typeof = "UR_JSON_NULL", ur_json_integer = "0", ur_json_real = "0" }
function M.none(f)
  if NONE_OF[f.name] then return NONE_OF[f.name] end
  if f.ret:find("*", 1, true) then return "NULL" end
  return assert(NONE[f.ret], "no NULL answer known for the type " .. f.ret .. " (" .. f.name .. ")")
end

local function call(f, null_name)
  local args = {}
  for _, p in ipairs(f.params) do
    if not p.pointer then
      args[#args + 1] = ("(%s)1"):format(p.type)
    elseif p.optional or p.name == null_name or null_name == nil then
      args[#args + 1] = ("(%s)NULL"):format(p.type)
    else
      args[#args + 1] = ("(%s)(void *)zeroed"):format(p.type)
    end
  end
  return ("%s(%s)"):format(f.name, table.concat(args, ", "))
end

-- The C program's source.
function M.program(funcs, headers)
  local o = {}
  local function w(s) o[#o + 1] = s end
  w("/* Generated by spec/support/capi.lua from " .. table.concat(headers, ", ") .. "; do not edit.")
  w(" * Calls every function of the C API with NULL pointers (spec/capi_null_spec.lua). */")
  w("#include <math.h>\n#include <signal.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>")
  w("#include <sys/wait.h>\n#include <unistd.h>\n#include \"uvmrec.h\"\n#include \"uvmrec_lua.h\"\n")
  w("static _Alignas(64) unsigned char zeroed[1 << 16];\n")
  w([[static int invalid(const char *fn, const char *arg, ur_status rc) {
  char want[256];
  snprintf(want, sizeof want, "%s: argument '%s' is NULL", fn, arg);
  if (rc == UR_STATUS_INVALID && strstr(ur_last_error(), want)) return 0;
  printf("FAIL %s %s: returned %d (%s) with the message '%s'; expected %d (invalid) and '%s'\n", fn,
         arg, (int)rc, ur_status_name(rc), ur_last_error(), (int)UR_STATUS_INVALID, want);
  return 1;
}

/* A value-returning function's answer for a NULL argument: ok is whether it is the rule's. */
static int none(const char *fn, const char *arg, int ok, const char *want) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s: argument '%s' is NULL", fn, arg);
  if (ok && strstr(ur_last_error(), msg)) return 0;
  printf("FAIL %s %s: %s with the message '%s'; expected %s and '%s'\n", fn, arg,
         ok ? "answered as expected" : "answered otherwise", ur_last_error(), want, msg);
  return 1;
}
]])
  local cases = {}
  for _, f in ipairs(funcs) do
    local kind = M.kind(f)
    if kind == "status" then
      for _, name in ipairs(M.required(f)) do
        local id = ("c_%s__%s"):format(f.name, name)
        w(("static int %s(void) { return invalid(\"%s\", \"%s\", %s); }"):format(id, f.name, name, call(f, name)))
        cases[#cases + 1] = { f.name, name, id }
      end
    elseif kind == "value" then
      local want = M.none(f)
      for _, name in ipairs(M.required(f)) do
        local id = ("c_%s__%s"):format(f.name, name)
        local test = want == "isnan" and ("isnan((double)%s)"):format(call(f, name))
          or want == "NULL" and ("(const void *)%s == NULL"):format(call(f, name))
          or ("%s == %s"):format(call(f, name), want)
        w(("static int %s(void) { int ok = %s; return none(\"%s\", \"%s\", ok, \"%s\"); }"):format(
          id, test, f.name, name, want))
        cases[#cases + 1] = { f.name, name, id }
      end
    elseif kind == "void" then
      local id = "c_" .. f.name
      w(("static int %s(void) { %s; return 0; }"):format(id, call(f, nil)))
      cases[#cases + 1] = { f.name, "NULL", id }
    end
  end
  w("\nstatic const struct { const char *fn, *arg; int (*run)(void); } cases[] = {")
  for _, c in ipairs(cases) do w(("  {\"%s\", \"%s\", %s},"):format(c[1], c[2], c[3])) end
  w("};\nstatic const char *const functions[] = {")
  for _, f in ipairs(funcs) do w(("  \"%s\","):format(f.name)) end
  w("};\n")
  w([[/* No argument: every case, a line each ("ok FN ARG" or "FAIL FN ARG: why"); --list: the
 * functions this program was made from. */
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--list")) {
    for (size_t i = 0; i < sizeof functions / sizeof *functions; i++) printf("%s\n", functions[i]);
    return 0;
  }
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
      int rc = cases[i].run();
      fflush(stdout);
      _exit(rc);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return 2;
    if (WIFSIGNALED(status)) {
      printf("FAIL %s %s: killed by signal %d (%s)\n", cases[i].fn, cases[i].arg, WTERMSIG(status),
             strsignal(WTERMSIG(status)));
      failed++;
    } else if (WEXITSTATUS(status)) {
      if (WEXITSTATUS(status) != 1)
        printf("FAIL %s %s: exit code %d\n", cases[i].fn, cases[i].arg, WEXITSTATUS(status));
      failed++;
    } else {
      printf("ok %s %s\n", cases[i].fn, cases[i].arg);
    }
  }
  return failed ? 1 : 0;
}]])
  return table.concat(o, "\n") .. "\n"
end

if arg and arg[0] and arg[0]:match("capi%.lua$") and #arg > 0 then
  local headers = {}
  for i = 1, #arg do headers[i] = arg[i] end
  io.write(M.program(M.from_headers(headers), headers))
end

return M
