/* main.c: the `uvmrec` command, after luajit.c: scripts, -e, -l, -i and the REPL, plus
 * --version, `uvmrec env` and subcommands (`uvmrec NAME` runs scripts/NAME.lua of the tree). */
#include <dirent.h>
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>

#include "host.h"

#define PROG "uvmrec"

#ifndef UR_HOST_CUDA_ARCHS
#define UR_HOST_CUDA_ARCHS ""
#endif

/* 2: bad command line; 130 (128 + SIGINT, as a shell reports it): Ctrl-C stopped the script
 * where it stood (ur_lua_pcall's handler), so launch tells an interrupted rank from a failed one. */
enum { EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 };

static void list_commands(const ur__lua_paths *p, char *out, size_t len);
static int print_command_summaries(void);

static void usage(FILE *f) {
  char known[4096] = "(none found: no uvmrec tree beside this program)";
  ur__lua_paths p;
  if (ur__lua_paths_find(&p) == UR_STATUS_OK) list_commands(&p, known, sizeof known);
  fprintf(f,
          "usage: " PROG " [options] [script [args...]]\n"
          "       " PROG " COMMAND [args...]\n"
          "Options:\n"
          "  -e code        run the Lua code\n"
          "  -l name        require the module `name`\n"
          "  -i             the REPL after the script (bare `" PROG "` starts it too)\n"
          "  -v, --version  the version, the CUDA build and the GPU in use\n"
          "  -h, --help     this text\n"
          "  --             stop handling options\n"
          "  -              run standard input as a script\n"
          "Commands:\n"
          "  env            print `export LUA_PATH=... LUA_CPATH=...` for plain luajit\n"
          "  NAME           run scripts/NAME.lua of the tree\n");
  if (f != stdout || !print_command_summaries()) fprintf(f, "The commands here: %s\n", known);
}

static char last_message[2048]; /* the last error printed: a failing rank's report to launch */

static void message(const char *msg) {
  snprintf(last_message, sizeof last_message, "%s", msg ? msg : "");
  fflush(stdout);
  fprintf(stderr, PROG ": %s\n", msg);
  fflush(stderr);
}

/* In a job of several ranks (mpirun's or `uvmrec launch`'s environment), every rank but 0
 * prefixes each line it prints with "[rank R] ": its standard output and error go through a
 * pipe to a thread that adds the prefix, so C's and Lua's prints alike carry it. Every rank's
 * standard output is line-buffered, so that no rank's line is cut by another's. */
typedef struct prefixer {
  int fd, out; /* the stream's descriptor; where its prefixed lines go */
  pthread_t thread;
  char prefix[32];
} prefixer;
static prefixer prefixers[2];
static int prefixing;

static void *prefix_lines(void *arg) {
  prefixer *p = arg;
  FILE *in = fdopen(p->fd, "r");
  char line[8192 + sizeof p->prefix];
  size_t pl = strlen(p->prefix);
  int start = 1;
  memcpy(line, p->prefix, pl);
  /* The prefix and the line in one write, so that ranks sharing a terminal do not cut in. */
  while (in && fgets(line + pl, 8192, in)) {
    size_t n = strlen(line + pl);
    const char *from = start ? line : line + pl;
    if (write(p->out, from, n + (start ? pl : 0)) < 0) break;
    start = n > 0 && line[pl + n - 1] == '\n';
  }
  if (in) fclose(in);
  return NULL;
}

static void prefix_drain(void) {
  if (!prefixing) return;
  prefixing = 0;
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < 2; i++) {
    dup2(prefixers[i].out, i + 1); /* closes the pipe's last write end: the thread sees EOF */
    pthread_join(prefixers[i].thread, NULL);
  }
}

static int env_number(const char *a, const char *b, const char *c) {
  const char *names[] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(names[i]);
    if (v && *v) return atoi(v);
  }
  return -1;
}

static void rank_prefix(void) {
  int rank = env_number("OMPI_COMM_WORLD_RANK", "PMI_RANK", "UVMREC_RANK");
  int world = env_number("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "UVMREC_WORLD");
  if (rank < 0 || world <= 1) return;
  setvbuf(stdout, NULL, _IOLBF, 0); /* a pipe would flush rank 0's lines in blocks */
  if (rank == 0) return;
  for (int i = 0; i < 2; i++) {
    int fds[2];
    prefixer *p = &prefixers[i];
    if (pipe(fds)) return;
    p->out = dup(i + 1);
    p->fd = fds[0];
    snprintf(p->prefix, sizeof p->prefix, "[rank %d] ", rank);
    dup2(fds[1], i + 1);
    close(fds[1]);
    if (pthread_create(&p->thread, NULL, prefix_lines, p)) {
      dup2(p->out, i + 1);
      return;
    }
  }
  prefixing = 1;
  atexit(prefix_drain);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Subcommands: scripts/NAME.lua of the tree, and the built-in env; sorted, comma-separated. */
static void list_commands(const ur__lua_paths *p, char *out, size_t len) {
  char *names[256];
  int n = 0;
  names[n++] = strdup("env");
  DIR *d = p->scripts[0] ? opendir(p->scripts) : NULL;
  struct dirent *e;
  while (d && n < 256 && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 4 && !strcmp(e->d_name + l - 4, ".lua") && e->d_name[0] != '_')
      names[n++] = strndup(e->d_name, l - 4);
  }
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    if (names[i]) {
      size_t used = strlen(out);
      snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i]);
    }
    free(names[i]);
  }
}

/* For --help, each command with its summary line, read from its declaration by Lua
 * (lua/uvmrec/cli.lua); 0 when that fails, and the names alone are listed instead. */
static int print_command_summaries(void) {
  lua_State *L;
  if (ur_lua_open(&L)) return 0;
  fflush(stdout);
  ur_status s = ur_lua_dostring(L, "require('uvmrec.cli').print_commands()", "=(--help)", 0);
  ur_lua_close(L);
  return s == UR_STATUS_OK;
}

/* A word that names a command rather than a file: no folder, no extension. */
static int is_command_word(const char *s) {
  if (!*s || *s == '-') return 0;
  for (; *s; s++)
    if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9') ||
          *s == '_' || *s == '-'))
      return 0;
  return 1;
}

static void print_version(void) {
  printf("uvmrec %s (%s)\n", ur_version(), LUAJIT_VERSION);
  if (ur_cuda_built()) {
    const char *archs = ur_cuda_archs();
    if (!*archs) archs = UR_HOST_CUDA_ARCHS;
    printf("CUDA: built, libuvmrec_cuda.so loads (%s)\n", *archs ? archs : "architectures unknown");
  } else {
    printf("CUDA: not available (%s)\n", ur_cuda_error());
  }
  int n = ur_device_count();
  if (n <= 0) {
    printf("GPU: no GPU (%s)\n", ur_cuda_error());
  }
  for (int i = 0; i < n; i++) {
    ur_device_props props;
    if (ur_device_props_get(i, &props) != UR_STATUS_OK) {
      printf("GPU: cuda:%d (%s)\n", i, ur_last_error());
      continue;
    }
    printf("GPU: cuda:%d %s, compute capability %d.%d, %d SMs, %.1f GiB\n", i, props.name,
           (int)props.major, (int)props.minor, (int)props.sm_count,
           (double)props.total_bytes / (1024.0 * 1024.0 * 1024.0));
  }
}

/* `uvmrec env` takes no arguments but --help, answered as the scripts' commands answer. */
static int print_env(char **args) {
  static const char usage_line[] = "usage: uvmrec env [-h]";
  if (args[0] && (!strcmp(args[0], "-h") || !strcmp(args[0], "--help"))) {
    printf("%s\n\nprint `export LUA_PATH=... LUA_CPATH=...` for plain luajit: "
           "eval \"$(uvmrec env)\"\n\nOptions:\n"
           "   -h, --help            Show this help and exit.\n",
           usage_line);
    return 0;
  }
  if (args[0]) {
    fprintf(stderr, PROG " env: %s '%s'\n%s\n",
            args[0][0] == '-' ? "unknown option" : "takes no argument, not", args[0], usage_line);
    return EXIT_USAGE;
  }
  ur__lua_paths p;
  if (ur__lua_paths_find(&p)) {
    message(ur_lua_last_error());
    return 1;
  }
  if (!strcmp(p.layout, "none")) {
    message("no uvmrec tree found beside this program; set UVMREC_ROOT");
    return 1;
  }
  if (p.self_contained) {
    message("env: a dist tree has the engine only inside this program, not as libuvmrec.so for "
            "plain luajit; run scripts with it, or use a checkout or `make install`");
    return 1;
  }
  printf("export LUA_PATH='%s;;' LUA_CPATH='%s;;'\n", p.path, p.cpath);
  return 0;
}

#define FLAG_INTERACTIVE 1
#define FLAG_VERSION 2
#define FLAG_EXEC 4
#define FLAG_HELP 8
#define FLAG_LIB 16

/* The index of the script (or command) in argv, 0 when there is none, -1 for a bad option
 * (what is wrong with it in bad, of size n). */
static int collect_args(char **argv, int *flags, char *bad, size_t n) {
  for (int i = 1; argv[i]; i++) {
    const char *a = argv[i];
    if (a[0] != '-') return i;
    if (!strcmp(a, "--version") || !strcmp(a, "-v")) {
      *flags |= FLAG_VERSION;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *flags |= FLAG_HELP;
    } else if (!strcmp(a, "--")) {
      return argv[i + 1] ? i + 1 : 0;
    } else if (!strcmp(a, "-")) {
      return i;
    } else if (!strcmp(a, "-i")) {
      *flags |= FLAG_INTERACTIVE;
    } else if (a[1] == 'e' || a[1] == 'l') {
      *flags |= a[1] == 'e' ? FLAG_EXEC : FLAG_LIB;
      if (a[2] == 0 && !argv[++i]) {
        snprintf(bad, n, "option '%s' needs an argument", a);
        return -1;
      }
    } else {
      snprintf(bad, n, "unknown option '%s'", a);
      return -1;
    }
  }
  return 0;
}

static int report(ur_status s) {
  if (s) message(ur_lua_last_error());
  return s == UR_STATUS_OK ? 0 : s == UR_STATUS_INTERRUPTED ? EXIT_INTERRUPTED : 1;
}

static int run_options(lua_State *L, char **argv, int n) {
  for (int i = 1; i < n; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l')) continue;
    const char *v = a[2] ? a + 2 : argv[++i];
    if (a[1] == 'e') {
      int code = report(ur_lua_dostring(L, v, "=(command line)", 0));
      if (code) return code;
    } else {
      lua_getglobal(L, "require");
      lua_pushstring(L, v);
      int code = report(ur_lua_pcall(L, 1, 0));
      if (code) return code;
    }
  }
  return 0;
}

/* `arg` as luajit gives it: the script at 0, its arguments from 1, what came before negative.
 * A command's script stands at 0 in place of the command's name. */
static int set_args(lua_State *L, char **argv, int argc, int script, const char *file) {
  lua_createtable(L, argc - script, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, i == script && file ? file : argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
  for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
  return argc - script - 1;
}

static int run_script(lua_State *L, char **argv, int argc, int script, const char *file) {
  const char *path = file ? file : argv[script];
  if (!file && !strcmp(path, "-") && strcmp(argv[script - 1], "--")) path = NULL;
  int nargs;
  if (!lua_checkstack(L, argc + 3)) {
    message("too many arguments");
    return 1;
  }
  int rc = luaL_loadfile(L, path);
  if (rc) {
    message(lua_tostring(L, -1));
    return 1;
  }
  nargs = set_args(L, argv, argc, script, file);
  return report(ur_lua_pcall(L, nargs, 0));
}

/* Under `uvmrec launch` (UVMREC_JOB, a folder of the job's): each rank notes its process id when
 * it starts (rank-R.pid) and its exit code with its last error when it ends (rank-R.exit), so
 * launch can forward Ctrl-C to every rank and name a rank that failed, or one that died
 * without a word (killed by a signal, or by the kernel when out of memory). */
static void job_note(const char *kind, int code, const char *text) {
  const char *dir = getenv("UVMREC_JOB");
  int rank = env_number("OMPI_COMM_WORLD_RANK", "PMI_RANK", "UVMREC_RANK");
  if (!dir || !*dir || rank < 0) return;
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s/rank-%d.%s", dir, rank, kind);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%d\t%s\n", code, text);
  if (fclose(f) == 0) rename(tmp, path);
}

static int finish(int status) {
  /* A failing rank of a job under MPI aborts the job rather than leave the others waiting;
   * its message goes out first. */
  job_note("exit", status, status ? last_message : "");
  prefix_drain();
  ur_comm_exit(status);
  return status;
}

int main(int argc, char **argv) {
  setlocale(LC_CTYPE, "");
  rank_prefix();
  job_note("pid", (int)getpid(), "");
  int flags = 0;
  char bad[256];
  int script = collect_args(argv, &flags, bad, sizeof bad);
  if (script < 0) {
    message(bad);
    usage(stderr);
    return finish(EXIT_USAGE);
  }
  if (flags & FLAG_HELP) {
    usage(stdout);
    return 0;
  }

  char command_file[PATH_MAX + 64] = "";
  if (script > 0 && is_command_word(argv[script]) && strcmp(argv[script - 1], "--")) {
    if (!strcmp(argv[script], "env")) return print_env(argv + script + 1);
    ur__lua_paths p;
    if (ur__lua_paths_find(&p)) {
      message(ur_lua_last_error());
      return finish(1);
    }
    char text[8192]; /* the command list and a path fit */
    if (!strcmp(p.layout, "none")) {
      snprintf(text, sizeof text,
               "'%s' is a command of a uvmrec tree, and no tree was found beside this program "
               "(%s); set UVMREC_ROOT to a checkout, a dist tree or an install prefix",
               argv[script], p.binary);
      message(text);
      return finish(1);
    }
    snprintf(command_file, sizeof command_file, "%s/%s.lua", p.scripts, argv[script]);
    if (!p.scripts[0] || access(command_file, R_OK) != 0) {
      char known[4096];
      list_commands(&p, known, sizeof known);
      snprintf(text, sizeof text, "'%s' is not a command; the commands are: %s", argv[script],
               known);
      message(text);
      return finish(EXIT_USAGE);
    }
  }

  if (flags & FLAG_VERSION) {
    print_version();
    if (!script && !(flags & (FLAG_EXEC | FLAG_LIB | FLAG_INTERACTIVE))) return 0;
  }

  lua_State *L;
  ur_status opened = ur_lua_open(&L);
  if (opened) return finish(report(opened)); /* 130 when Ctrl-C stopped the loading */
  int status = run_options(L, argv, script > 0 ? script : argc);
  if (!status && script > 0)
    status = run_script(L, argv, argc, script, command_file[0] ? command_file : NULL);
  if (!status && ((flags & FLAG_INTERACTIVE) ||
                  (!script && !(flags & (FLAG_EXEC | FLAG_VERSION))))) {
    ur_status s = ur_lua_repl(L);
    if (s) {
      message(ur_lua_last_error());
      status = 1;
    }
  }
  /* Noted before closing too: the close runs the finalizers, which can wait for, or crash on,
   * collectives the other ranks never finish once a rank failed. */
  if (status) job_note("exit", status, last_message);
  ur_lua_close(L);
  return finish(status);
}
