/* uvmrec_lua.h: embedding the engine's Lua face (LuaJIT) in a host C program.
 *
 * Link libuvmrec_lua and libuvmrec (`pkg-config --cflags --libs uvmrec-lua`); hosts that do not
 * want Lua use uvmrec.h alone.  A state from ur_lua_open has the standard libraries, package.path
 * and package.cpath pointing at the uvmrec tree found beside the binary holding this code (a
 * source tree's build, an installed prefix or a dist tree; UVMREC_ROOT overrides), and
 * `require "uvmrec"` already done, so Lua code drives the same engine as the host's C calls.
 * A host that links LuaJIT and the engine statically must export their symbols (-Wl,-E), or the
 * Lua side would load a second copy of the engine.
 *
 * Failures return ur_status; the message (with a Lua traceback where there is one) is in
 * ur_lua_last_error(), thread-local like ur_last_error(). */
#ifndef UVMREC_LUA_H
#define UVMREC_LUA_H

#include "uvmrec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Support for the Lua library: run directories, paths, the terminal's width and processes
 * (engine/src/io/os.c, in libuvmrec so that plain LuaJIT finds them too).  Not part of the
 * engine's C API.  make appends this marked block to lua/uvmrec/cdef.lua. */
/* UR_CDEF_BEGIN */
/* Run directories: entries of dir named prefix...suffix, sorted, each followed by '\n', into
 * buf[len] (NUL-terminated); *needed is the bytes the whole list takes (retry when > len). */
UR_API ur_status ur_dir_list(const char *dir, const char *prefix /* or NULL */,
                             const char *suffix /* or NULL */, char *buf, uint64_t len,
                             uint64_t *needed);
UR_API ur_status ur_dir_create(const char *path);  /* with its parents; existing is fine */
UR_API int32_t ur_path_kind(const char *path);      /* 0 missing, 1 file, 2 directory, 3 other */
/* A file written whole: data[len] into a temporary file beside path, synced, renamed onto path
 * and the folder synced, so path holds the old bytes or the new ones, also after a crash. */
UR_API ur_status ur_file_write(const char *path, const void *data, uint64_t len);
/* A file written a part at a time: a new empty file beside path, named path.tmp-XXXXXX as
 * ur_file_write's (unique, so no file of the caller's is taken for it), its name into buf[len]
 * (len at least strlen(path) + 12); the caller fills it, then renames it onto path or removes it. */
UR_API ur_status ur_file_temp(const char *path, char *buf, uint64_t len);
/* A terminal's width in columns (80 when the terminal does not say), or 0 when fd is not a
 * terminal: a progress bar on a terminal, plain lines on a pipe. */
UR_API int32_t ur_term_columns(int32_t fd);
/* Processes (`uvmrec launch`): argv[0] run through PATH in a child that shares our output;
 * wait (pid -1: any child, *which: the one that ended) gives its exit code, 128 + the signal
 * that ended it, or -1 while it runs (nohang). */
UR_API ur_status ur_proc_spawn(const char *const *argv, int32_t *pid);
UR_API ur_status ur_proc_wait(int32_t pid, int32_t nohang, int32_t *status,
                              int32_t *which /* or NULL */);
UR_API ur_status ur_proc_kill(int32_t pid, int32_t sig);
UR_API int32_t ur_proc_uid(void);                  /* the effective user id (0: root) */
UR_API ur_status ur_env_set(const char *name, const char *value /* or NULL: unset */);
UR_API int32_t ur_cpu_count(void);                 /* cores this process may run on */
UR_API ur_status ur_dir_temp(char *templ);         /* mkdtemp: templ ends in XXXXXX */
/* UR_CDEF_END */

struct lua_State;

/* A new state, or UR_STATUS_IO when the Lua modules are not found, UR_STATUS_OOM without memory,
 * UR_STATUS_INTERRUPTED when SIGINT stopped their loading. */
UR_API ur_status ur_lua_open(struct lua_State **out);
UR_API void ur_lua_close(struct lua_State *L);

/* Calls the function below nargs arguments on top of the stack, as lua_pcall does, with a
 * traceback handler.  On success nresults values (LUA_MULTRET: all) replace them; on failure
 * nothing does, and the status is UR_STATUS_INTERRUPTED after Ctrl-C, UR_STATUS_OOM for memory
 * and UR_STATUS_INVALID for an error the code raised.  While it runs, SIGINT stops the Lua code
 * and the engine's long operations (ur_interrupt_set), unless the host installed its own
 * SIGINT handler, which is then left alone. */
UR_API ur_status ur_lua_pcall(struct lua_State *L, int nargs, int nresults);

/* Loads and runs a file (NULL: standard input) or a string, leaving nresults values on success.
 * A chunk that does not compile is UR_STATUS_INVALID (UR_STATUS_IO when the file cannot be read). */
UR_API ur_status ur_lua_dofile(struct lua_State *L, const char *path, int nresults);
UR_API ur_status ur_lua_dostring(struct lua_State *L, const char *code, const char *chunkname,
                                 int nresults);

/* The interactive loop: line editing, completion and history (~/.uvmrec_history) on a terminal;
 * without one, reads and evaluates standard input line by line.  Returns at end of input or
 * after Ctrl-C twice at an empty prompt: UR_STATUS_OK, or UR_STATUS_INVALID when a chunk read
 * from a pipe failed (so scripted sessions can be checked). */
UR_API ur_status ur_lua_repl(struct lua_State *L);

UR_API const char *ur_lua_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
