/* repl.c: the interactive loop (ur_lua_repl): libedit line editing, history and completion on a
 * terminal, plain line reading from a pipe.  The Lua half (compiling what was typed, printing
 * results, completion candidates) is lua/uvmrec/repl.lua. */
#include <histedit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <termios.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

#include "host.h"

typedef struct repl {
  lua_State *L;
  int module;             /* registry reference to uvmrec.repl */
  EditLine *el;           /* NULL without a terminal */
  History *hist;
  char history_path[PATH_MAX];
  char prompt[128];
  int ctrl_c;             /* set by the Ctrl-C key while editing */
  int tty_saved;          /* tty holds the terminal's settings before the editor */
  struct termios tty;
} repl;

static void push_fn(repl *r, const char *name) {
  lua_rawgeti(r->L, LUA_REGISTRYINDEX, r->module);
  lua_getfield(r->L, -1, name);
  lua_remove(r->L, -2);
}

static void set_prompt(repl *r, int first) {
  lua_rawgeti(r->L, LUA_REGISTRYINDEX, r->module);
  lua_getfield(r->L, -1, first ? "prompt" : "prompt2");
  const char *p = lua_tostring(r->L, -1);
  snprintf(r->prompt, sizeof r->prompt, "%s", p ? p : (first ? "> " : ">> "));
  lua_pop(r->L, 2);
}

static char *prompt_fn(EditLine *el) {
  repl *r;
  el_get(el, EL_CLIENTDATA, &r);
  return r->prompt;
}

/* Ctrl-C while editing: the terminal's ISIG is off at the prompt (see edit_open), so the key
 * arrives here instead of as a signal; the loop discards the input, or exits when it is the
 * second at an empty prompt. */
static unsigned char interrupt_key(EditLine *el, int ch) {
  (void)ch;
  repl *r;
  el_get(el, EL_CLIENTDATA, &r);
  r->ctrl_c = 1;
  return CC_NEWLINE;
}

static void list_candidates(repl *r, lua_State *L, int n) {
  int cols = 80, width = 0;
  el_get(r->el, EL_GETTC, "co", &cols, NULL);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    int w = (int)lua_objlen(L, -1);
    if (w > width) width = w;
    lua_pop(L, 1);
  }
  width += 2;
  int per_line = cols > width ? cols / width : 1, shown = n > 200 ? 200 : n;
  fputc('\n', stdout);
  for (int i = 1; i <= shown; i++) {
    lua_rawgeti(L, -1, i);
    fprintf(stdout, "%-*s", (i % per_line && i < shown) ? width : 0, lua_tostring(L, -1));
    if (i % per_line == 0 || i == shown) fputc('\n', stdout);
    lua_pop(L, 1);
  }
  if (shown < n) fprintf(stdout, "... and %d more\n", n - shown);
  fflush(stdout);
}

/* Tab: completes the name before the cursor as far as the candidates agree, and lists them
 * when they go different ways. */
static unsigned char complete_key(EditLine *el, int ch) {
  (void)ch;
  repl *r;
  el_get(el, EL_CLIENTDATA, &r);
  lua_State *L = r->L;
  int top = lua_gettop(L);
  const LineInfo *li = el_line(el);
  push_fn(r, "complete");
  lua_pushlstring(L, li->buffer, (size_t)(li->cursor - li->buffer));
  if (lua_pcall(L, 1, 2, 0) || !lua_isstring(L, -2) || !lua_istable(L, -1)) {
    lua_settop(L, top);
    return CC_REFRESH_BEEP;
  }
  size_t wlen = lua_objlen(L, -2);
  int n = (int)lua_objlen(L, -1);
  unsigned char ret = CC_REFRESH_BEEP;
  if (n > 0) {
    lua_rawgeti(L, -1, 1);
    const char *first = lua_tostring(L, -1);
    size_t common = strlen(first);
    for (int i = 2; i <= n; i++) {
      lua_rawgeti(L, -2, i);
      const char *s = lua_tostring(L, -1);
      size_t k = 0;
      while (k < common && s[k] == first[k]) k++;
      common = k;
      lua_pop(L, 1);
    }
    if (common > wlen) {
      char add[256];
      snprintf(add, sizeof add, "%.*s", (int)(common - wlen), first + wlen);
      ret = el_insertstr(el, add) == 0 ? CC_REFRESH : CC_REFRESH_BEEP;
      lua_pop(L, 1);
    } else if (n > 1) {
      lua_pop(L, 1);
      list_candidates(r, L, n);
      ret = CC_REDISPLAY;
    } else {
      ret = CC_REFRESH;
    }
  }
  lua_settop(L, top);
  return ret;
}

static void edit_open(repl *r) {
  HistEvent ev;
  r->hist = history_init();
  if (r->hist) {
    history(r->hist, &ev, H_SETSIZE, 1000);
    history(r->hist, &ev, H_SETUNIQUE, 1);
    const char *home = getenv("HOME");
    if (home && *home) {
      snprintf(r->history_path, sizeof r->history_path, "%s/.uvmrec_history", home);
      history(r->hist, &ev, H_LOAD, r->history_path);
    }
  }
  r->tty_saved = tcgetattr(STDIN_FILENO, &r->tty) == 0;
  r->el = el_init("uvmrec", stdin, stdout, stderr);
  if (!r->el) return;
  el_set(r->el, EL_CLIENTDATA, r);
  el_set(r->el, EL_EDITOR, "emacs");
  el_set(r->el, EL_PROMPT, prompt_fn);
  if (r->hist) el_set(r->el, EL_HIST, history, r->hist);
  /* Ctrl-C is a key (interrupt_key) at the prompt and between prompts too (-x: the mode the
   * editor leaves the terminal in), so a Ctrl-C typed ahead waits for the next prompt instead of
   * ending the process; only running code has ISIG on (code_signals), where Ctrl-C is SIGINT
   * (ur_lua_pcall). */
  el_set(r->el, EL_SETTY, "-d", "-isig", NULL);
  el_set(r->el, EL_SETTY, "-x", "-isig", NULL);
  el_set(r->el, EL_ADDFN, "ur-complete", "complete the name before the cursor", complete_key);
  el_set(r->el, EL_ADDFN, "ur-interrupt", "discard the input; twice at an empty prompt: exit",
         interrupt_key);
  el_set(r->el, EL_BIND, "^I", "ur-complete", NULL);
  el_set(r->el, EL_BIND, "^C", "ur-interrupt", NULL);
  el_source(r->el, NULL);
}

/* While a chunk runs (on), Ctrl-C on the terminal is SIGINT, which stops the code; else a key. */
static void code_signals(repl *r, int on) {
  struct termios t;
  if (!r->el || tcgetattr(STDIN_FILENO, &t)) return;
  if (on) t.c_lflag |= ISIG;
  else t.c_lflag &= ~(tcflag_t)ISIG;
  tcsetattr(STDIN_FILENO, TCSANOW, &t);
}

static void edit_close(repl *r) {
  if (r->el) el_end(r->el);
  if (r->tty_saved) tcsetattr(STDIN_FILENO, TCSADRAIN, &r->tty);
  if (r->hist) history_end(r->hist);
}

static void history_add(repl *r, const char *line) {
  HistEvent ev;
  if (!r->hist || !*line) return;
  history(r->hist, &ev, H_ENTER, line);
  if (r->history_path[0]) history(r->hist, &ev, H_SAVE, r->history_path);
}

typedef struct buf {
  char *p;
  size_t len, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) return 0;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
  return 1;
}

/* The next line without its newline in *line, or 0 at the end of input. */
static int read_line(repl *r, int first, buf *line) {
  line->len = 0;
  if (r->el) {
    int count;
    set_prompt(r, first);
    r->ctrl_c = 0;
    const char *s = el_gets(r->el, &count);
    /* A line ended by the Ctrl-C key has no newline (editline's own newline key adds it), so
     * an empty one comes back as NULL, like the end of input. */
    if (r->ctrl_c) {
      fputc('\n', stdout);
      return s && count > 0 ? buf_add(line, s, (size_t)count) : 1;
    }
    if (!s || count <= 0) return 0;
    if (!buf_add(line, s, (size_t)count)) return 0;
  } else {
    for (;;) {
      int c = getchar();
      if (c == EOF) {
        if (line->len == 0) return 0;
        break;
      }
      char ch = (char)c;
      if (!buf_add(line, &ch, 1)) return 0;
      if (c == '\n') break;
    }
  }
  while (line->len && (line->p[line->len - 1] == '\n' || line->p[line->len - 1] == '\r'))
    line->p[--line->len] = 0;
  return 1;
}

static void report(void) {
  fflush(stdout);
  fprintf(stderr, "%s\n", ur_lua_last_error());
  fflush(stderr);
}

/* Runs code: ur_lua_pcall with the terminal's Ctrl-C as SIGINT for just that long (the call
 * catches it and stops the code; outside it SIGINT would end the REPL). */
static ur_status pcall_code(repl *r, int nargs, int nresults) {
  code_signals(r, 1);
  ur_status s = ur_lua_pcall(r->L, nargs, nresults);
  code_signals(r, 0);
  return s;
}

/* Runs the compiled chunk on top of the stack and prints its results; 0 when it failed. */
static int run_chunk(repl *r) {
  lua_State *L = r->L;
  int base = lua_gettop(L);
  if (pcall_code(r, 0, LUA_MULTRET)) {
    report();
    return 0;
  }
  int n = lua_gettop(L) - (base - 1);
  push_fn(r, "show");
  lua_insert(L, base);
  lua_pushinteger(L, n);
  lua_insert(L, base + 1);
  int ok = pcall_code(r, n + 1, 0) == UR_STATUS_OK;
  if (!ok) report();
  fflush(stdout);
  return ok;
}

static ur_status loop(repl *r) {
  lua_State *L = r->L;
  buf chunk = {0}, line = {0};
  int armed = 0, failed = 0, by_key = 0;
  for (;;) {
    int first = chunk.len == 0;
    if (!read_line(r, first, &line)) break;
    if (r->ctrl_c) {
      if (first && line.len == 0) {
        if (armed) {
          by_key = 1;
          break;
        }
        armed = 1;
        fputs("(Ctrl-C again to exit, or Ctrl-D)\n", stdout);
        fflush(stdout);
      }
      chunk.len = 0;
      continue;
    }
    armed = 0;
    if (first && strspn(line.p, " \t") == line.len) continue;
    if (r->el) history_add(r, line.p);
    if (!buf_add(&chunk, line.p, line.len) || !buf_add(&chunk, "\n", 1)) {
      ur__lua_error(UR_STATUS_OOM, "repl: out of memory");
      report();
      break;
    }
    push_fn(r, "compile");
    lua_pushlstring(L, chunk.p, chunk.len);
    if (ur_lua_pcall(L, 1, 2)) {
      report();
      failed++;
      chunk.len = 0;
      continue;
    }
    if (lua_isboolean(L, -2) && !lua_toboolean(L, -2)) { /* incomplete: read on */
      lua_pop(L, 2);
      continue;
    }
    chunk.len = 0;
    if (lua_isnil(L, -2)) {
      ur__lua_error(UR_STATUS_INVALID, "%s", lua_tostring(L, -1));
      lua_pop(L, 2);
      report();
      failed++;
      continue;
    }
    lua_pop(L, 1);
    if (!run_chunk(r)) failed++;
  }
  if (chunk.len) { /* input ended inside a chunk */
    ur__lua_error(UR_STATUS_INVALID, "stdin: input ended inside an unfinished chunk");
    report();
    failed++;
  }
  if (r->el && !by_key) fputc('\n', stdout);
  fflush(stdout);
  free(chunk.p);
  free(line.p);
  if (failed && !r->el)
    return ur__lua_error(UR_STATUS_INVALID, "repl: %d chunk%s failed", failed,
                         failed == 1 ? "" : "s");
  return UR_STATUS_OK;
}

ur_status ur_lua_repl(lua_State *L) {
  UR__LUA_ARG(L);
  repl r;
  memset(&r, 0, sizeof r);
  r.L = L;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "uvmrec.repl");
  ur_status s = ur_lua_pcall(L, 1, 1);
  if (s) return s;
  r.module = luaL_ref(L, LUA_REGISTRYINDEX);
  /* The engine as `ur`, as th has `torch`. */
  lua_getglobal(L, "ur");
  int have_ur = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (!have_ur) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "uvmrec");
    if (ur_lua_pcall(L, 1, 1) == UR_STATUS_OK) lua_setglobal(L, "ur");
    else report();
  }
  if (isatty(STDIN_FILENO)) {
    push_fn(&r, "banner");
    if (ur_lua_pcall(L, 0, 1) == UR_STATUS_OK) {
      fprintf(stdout, "%s\n", lua_tostring(L, -1));
      lua_pop(L, 1);
    } else {
      report();
    }
    fflush(stdout);
    edit_open(&r);
  }
  s = loop(&r);
  edit_close(&r);
  luaL_unref(L, LUA_REGISTRYINDEX, r.module);
  return s;
}
