/* host.h: internals shared by the Lua host's files (ur__lua names, never in a public header). */
#ifndef UR_HOST_H
#define UR_HOST_H

#include <limits.h>
#include "uvmrec_lua.h"

#define UR__HIDDEN __attribute__((visibility("hidden")))

/* Where the uvmrec tree is, found from the binary that holds this code. */
typedef struct ur__lua_paths {
  const char *layout;      /* "source", "install", "dist" or "none" (LuaJIT's default paths) */
  int self_contained;      /* 1: the tree's paths only, never the system's (a dist tree) */
  char binary[PATH_MAX];   /* the executable or library holding this code */
  char root[PATH_MAX];     /* the tree: a source checkout, an install prefix or a dist folder */
  char lua[PATH_MAX];      /* the folder holding uvmrec/init.lua */
  char cmods[PATH_MAX];    /* Lua C modules shipped in the tree, or "" */
  char lib[PATH_MAX];      /* libuvmrec.so, libuvmrec_cuda.so */
  char scripts[PATH_MAX];  /* subcommands: scripts/NAME.lua */
  char spec[PATH_MAX];     /* the spec suite, or "" where it is not shipped */
  char path[4 * PATH_MAX]; /* the tree's part of package.path and package.cpath */
  char cpath[4 * PATH_MAX];
} ur__lua_paths;

UR__HIDDEN ur_status ur__lua_paths_find(ur__lua_paths *out);

/* Sets the message ur_lua_last_error() returns, and returns status. */
UR__HIDDEN ur_status ur__lua_error(ur_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The C API's rule for a NULL argument (docs/reliability.md): UR_STATUS_INVALID, naming the
 * function and the argument, before anything is read. */
#define UR__LUA_ARG(p)                                                                            \
  do {                                                                                            \
    if (!(p)) return ur__lua_error(UR_STATUS_INVALID, "%s: argument '%s' is NULL", __func__, #p); \
  } while (0)

#endif
