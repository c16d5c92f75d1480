/* lua_host.c: Lua states for host programs.  Finds the uvmrec tree beside the binary holding
 * this code so `require "uvmrec"` works with no environment, runs code with a traceback and
 * Ctrl-C handling, and keeps the message of a failure for the host. */
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "host.h"

static _Thread_local char last_error[16384];

ur_status ur__lua_error(ur_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

const char *ur_lua_last_error(void) { return last_error; }

/* ---- finding the tree ---- */

static int has(const char *dir, const char *rel) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  return access(p, R_OK) == 0;
}

/* 0 when the path does not fit (the tree is then not used). */
static int join(char *out, const char *dir, const char *rel) {
  return snprintf(out, PATH_MAX, "%s/%s", dir, rel) < PATH_MAX;
}

typedef struct object_query {
  uintptr_t addr;
  const char *name; /* "" for the main program */
  int found;
} object_query;

static int find_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  object_query *q = data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && q->addr >= lo && q->addr < lo + ph->p_memsz) {
      q->name = info->dlpi_name ? info->dlpi_name : "";
      q->found = 1;
      return 1;
    }
  }
  return 0;
}

/* The file of the executable or shared library holding this code.  The main program is read
 * from /proc/self/exe: the name the loader keeps for it is argv[0], which has no folder when the
 * program was found through PATH. */
static int own_binary(char *out) {
  object_query q = {(uintptr_t)(void *)ur_lua_open, NULL, 0};
  dl_iterate_phdr(find_object, &q);
  const char *name = q.found && q.name[0] ? q.name : "/proc/self/exe";
  return realpath(name, out) != NULL;
}

/* Recognises the three layouts at root (made absolute); lib_hint is where the binary's own
 * libraries are when it sits in a build folder. */
static int try_root(const char *root_in, const char *lib_hint, ur__lua_paths *p) {
  char root[PATH_MAX];
  int ok = 1;
  if (!realpath(root_in, root)) return 0;
  if (has(root, "DIST") && has(root, "lua/uvmrec/init.lua")) {
    p->layout = "dist";
    p->self_contained = 1;
    ok = join(p->lua, root, "lua") && join(p->cmods, root, "lib/lua") &&
         join(p->lib, root, "lib") && join(p->scripts, root, "scripts") &&
         join(p->spec, root, "spec");
  } else if (has(root, "share/lua/5.1/uvmrec/init.lua")) {
    p->layout = "install";
    ok = join(p->lua, root, "share/lua/5.1") && join(p->cmods, root, "lib/lua/5.1") &&
         join(p->lib, root, "lib") && join(p->scripts, root, "share/uvmrec/scripts");
  } else if (has(root, "lua/uvmrec/init.lua")) {
    p->layout = "source";
    ok = join(p->lua, root, "lua") && join(p->scripts, root, "scripts") &&
         join(p->spec, root, "spec");
    if (!(lib_hint && has(lib_hint, "libuvmrec.so") && realpath(lib_hint, p->lib)))
      ok = ok && join(p->lib, root, "build/lib");
  } else {
    return 0;
  }
  if (!ok) return 0;
  memcpy(p->root, root, sizeof root);
  snprintf(p->path, sizeof p->path, "%s/?.lua;%s/?/init.lua", p->lua, p->lua);
  if (p->cmods[0])
    snprintf(p->cpath, sizeof p->cpath, "%s/?.so;%s/?.so", p->lib, p->cmods);
  else
    snprintf(p->cpath, sizeof p->cpath, "%s/?.so", p->lib);
  return 1;
}

ur_status ur__lua_paths_find(ur__lua_paths *p) {
  memset(p, 0, sizeof *p);
  p->layout = "none";
  if (!own_binary(p->binary)) snprintf(p->binary, sizeof p->binary, "?");
  const char *env = getenv("UVMREC_ROOT");
  if (env && *env) {
    if (try_root(env, NULL, p)) return UR_STATUS_OK;
    return ur__lua_error(UR_STATUS_IO,
                         "UVMREC_ROOT is '%s', which holds no uvmrec tree; expected a folder "
                         "with lua/uvmrec/init.lua or share/lua/5.1/uvmrec/init.lua", env);
  }
  char dir[PATH_MAX], up[PATH_MAX + 8], lib[PATH_MAX + 8];
  snprintf(dir, sizeof dir, "%s", p->binary);
  char *slash = strrchr(dir, '/');
  if (!slash) return UR_STATUS_OK;
  *slash = 0;
  /* bin/ or lib/ of a dist tree or a prefix, then build/bin/ or build/lib/ of a checkout. */
  snprintf(up, sizeof up, "%s/..", dir);
  snprintf(lib, sizeof lib, "%s/../lib", dir);
  if (try_root(up, lib, p)) return UR_STATUS_OK;
  snprintf(up, sizeof up, "%s/../..", dir);
  try_root(up, lib, p);
  return UR_STATUS_OK;
}

/* ---- running code ---- */

static lua_State *volatile sigint_L;
static volatile sig_atomic_t sigint_seen;

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  /* Not luaL_error: a C hook adds no frame of its own. */
  luaL_where(L, 0);
  lua_pushfstring(L, "%sinterrupted", lua_tostring(L, -1));
  lua_error(L);
}

/* Lua stops at the next hook (interpreted code and calls; compiled loops do not check hooks),
 * and long engine operations at their next poll.  The handler is one-shot (SA_RESETHAND), so a
 * second Ctrl-C ends a process that is stuck where neither checks. */
static void on_sigint(int sig) {
  (void)sig;
  sigint_seen = 1;
  ur_interrupt_set(1);
  lua_sethook(sigint_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static int traceback(lua_State *L) {
  if (!lua_isstring(L, 1)) {
    if (lua_isnoneornil(L, 1) || !luaL_callmeta(L, 1, "__tostring") || !lua_isstring(L, -1)) {
      lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
      return 1;
    }
    lua_remove(L, 1);
  }
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

ur_status ur_lua_pcall(lua_State *L, int nargs, int nresults) {
  UR__LUA_ARG(L);
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  struct sigaction old, sa;
  int catching = 0;
  if (sigaction(SIGINT, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
      old.sa_handler == SIG_DFL) {
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigint_L = L;
    sigint_seen = 0;
    catching = sigaction(SIGINT, &sa, NULL) == 0;
  }
  int rc = lua_pcall(L, nargs, nresults, base);
  int interrupted = 0;
  if (catching) {
    sigaction(SIGINT, &old, NULL);
    interrupted = sigint_seen;
    /* A Ctrl-C that came as the code finished must not stop the next call. */
    if (interrupted && lua_gethook(L) == stop_hook) lua_sethook(L, NULL, 0, 0);
    ur_interrupt_set(0);
  }
  lua_remove(L, base);
  if (rc == 0) return UR_STATUS_OK;
  const char *msg = lua_tostring(L, -1);
  ur__lua_error(UR_STATUS_INVALID, "%s", msg ? msg : "(error object is not a string)");
  lua_pop(L, 1);
  /* What the failed code held may be large: let it go now, as luajit does. */
  lua_gc(L, LUA_GCCOLLECT, 0);
  if (rc == LUA_ERRMEM) return UR_STATUS_OOM;
  return interrupted ? UR_STATUS_INTERRUPTED : UR_STATUS_INVALID;
}

static ur_status load_failed(lua_State *L, int rc) {
  const char *msg = lua_tostring(L, -1);
  ur__lua_error(UR_STATUS_INVALID, "%s", msg ? msg : "(error object is not a string)");
  lua_pop(L, 1);
  if (rc == LUA_ERRMEM) return UR_STATUS_OOM;
  return rc == LUA_ERRFILE ? UR_STATUS_IO : UR_STATUS_INVALID;
}

ur_status ur_lua_dofile(lua_State *L, const char *path, int nresults) {
  UR__LUA_ARG(L);
  int rc = luaL_loadfile(L, path);
  if (rc) return load_failed(L, rc);
  return ur_lua_pcall(L, 0, nresults);
}

ur_status ur_lua_dostring(lua_State *L, const char *code, const char *chunkname, int nresults) {
  UR__LUA_ARG(L);
  UR__LUA_ARG(code);
  int rc = luaL_loadbuffer(L, code, strlen(code), chunkname ? chunkname : code);
  if (rc) return load_failed(L, rc);
  return ur_lua_pcall(L, 0, nresults);
}

/* ---- opening a state ---- */

static void set_field(lua_State *L, const char *k, const char *v) {
  if (!v || !*v) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* Puts the tree's paths first (only them in a self-contained tree) and publishes where the tree
 * is as package.loaded["uvmrec.host"], for the command's scripts. */
static int setup(lua_State *L) {
  const ur__lua_paths *p = lua_touserdata(L, 1);
  lua_gc(L, LUA_GCSTOP, 0);
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);
  lua_getglobal(L, "package");
  if (strcmp(p->layout, "none")) {
    static const char *const keys[] = {"path", "cpath"};
    for (int i = 0; i < 2; i++) {
      const char *tree = i ? p->cpath : p->path;
      if (p->self_contained) {
        lua_pushstring(L, tree);
      } else {
        lua_getfield(L, -1, keys[i]);
        lua_pushfstring(L, "%s;%s", tree, lua_tostring(L, -1));
        lua_remove(L, -2);
      }
      lua_setfield(L, -2, keys[i]);
    }
  }
  lua_getfield(L, -1, "loaded");
  lua_newtable(L);
  set_field(L, "layout", p->layout);
  set_field(L, "binary", p->binary);
  set_field(L, "root", p->root);
  set_field(L, "lua", p->lua);
  set_field(L, "cmods", p->cmods);
  set_field(L, "lib", p->lib);
  set_field(L, "scripts", p->scripts);
  set_field(L, "spec", p->spec);
  set_field(L, "path", p->path);
  set_field(L, "cpath", p->cpath);
  lua_pushboolean(L, p->self_contained);
  lua_setfield(L, -2, "self_contained");
  lua_setfield(L, -2, "uvmrec.host");
  lua_pop(L, 2);
  return 0;
}

ur_status ur_lua_open(lua_State **out) {
  UR__LUA_ARG(out);
  *out = NULL;
  ur__lua_paths *p = malloc(sizeof *p);
  if (!p) return ur__lua_error(UR_STATUS_OOM, "lua: out of memory");
  ur_status s = ur__lua_paths_find(p);
  if (s) {
    free(p);
    return s;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    free(p);
    return ur__lua_error(UR_STATUS_OOM, "lua: cannot create a state: out of memory");
  }
  int rc = lua_cpcall(L, setup, p);
  free(p);
  if (rc) {
    s = load_failed(L, rc);
    lua_close(L);
    return s;
  }
  lua_getglobal(L, "require");
  lua_pushliteral(L, "uvmrec");
  s = ur_lua_pcall(L, 1, 0);
  if (s) {
    char msg[sizeof last_error];
    snprintf(msg, sizeof msg, "%s", last_error);
    lua_close(L);
    return ur__lua_error(s == UR_STATUS_OOM || s == UR_STATUS_INTERRUPTED ? s : UR_STATUS_IO,
                         "lua: require \"uvmrec\" failed: %s", msg);
  }
  *out = L;
  return UR_STATUS_OK;
}

void ur_lua_close(lua_State *L) {
  if (L) lua_close(L);
}
