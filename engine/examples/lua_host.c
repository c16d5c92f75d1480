/* lua_host.c: a host program that embeds the engine's Lua face: it makes a tensor through the
 * C API, hands it to a Lua snippet (which fills it and reads it through the same engine), and
 * reads the snippet's result back.
 *
 *   cc lua_host.c $(pkg-config --cflags --libs uvmrec-lua) -o lua_host && ./lua_host
 *
 * Exit status: 0 done, 1 a call failed (the engine's or Lua's message on stderr). */
#include <stdio.h>

#include <lauxlib.h>
#include <lua.h>

#include "uvmrec.h"
#include "uvmrec_lua.h"

static const char snippet[] =
    "local ur = require 'uvmrec'\n"
    "local n = ...\n"
    "local t = assert(ur.uvm_tensor({n, 8}, {device = ur.gpu() and 0 or -1}))\n"
    "t:uniform(0, 1, 42)\n"
    "local sum = 0\n"
    "for _, v in ipairs(t:totable()) do sum = sum + v end\n"
    "t:free()\n"
    "return sum / (n * 8), ur.memory().host\n";

int main(void) {
  lua_State *L;
  ur_memory_stats m;
  if (ur_lua_open(&L)) {
    fprintf(stderr, "lua_host: %s\n", ur_lua_last_error());
    return 1;
  }
  /* The snippet runs against this program's engine: a tensor made here shows in its memory. */
  const int64_t shape[1] = {1024};
  ur_tensor *mine;
  if (ur_tensor_new(&mine, UR_DTYPE_F32, 1, shape, UR_PLACE_HOST, UR_LOC_CPU)) {
    fprintf(stderr, "lua_host: %s\n", ur_last_error());
    ur_lua_close(L);
    return 1;
  }
  if (luaL_loadstring(L, snippet)) {
    fprintf(stderr, "lua_host: %s\n", lua_tostring(L, -1));
    goto failed;
  }
  lua_pushinteger(L, 1000);
  if (ur_lua_pcall(L, 1, 2)) {
    fprintf(stderr, "lua_host: %s\n", ur_lua_last_error());
    goto failed;
  }
  double mean = lua_tonumber(L, -2), host_seen = lua_tonumber(L, -1);
  lua_pop(L, 2);
  ur_memory_get(&m);
  printf("mean of 8000 uniform draws made in Lua: %.4f\n", mean);
  printf("host bytes: %.0f seen from Lua, %llu from C (one engine)\n", host_seen,
         (unsigned long long)m.bytes[UR_PLACE_HOST]);
  /* An error in Lua comes back as a status and a message with a traceback. */
  if (ur_lua_dostring(L, "error('from Lua')", "=snippet", 0) == UR_STATUS_INVALID)
    printf("error reported: %.40s\n", ur_lua_last_error());
  ur_tensor_free(mine);
  ur_lua_close(L);
  return mean > 0.45 && mean < 0.55 && host_seen == (double)m.bytes[UR_PLACE_HOST] ? 0 : 1;

failed:
  ur_tensor_free(mine);
  ur_lua_close(L);
  return 1;
}
