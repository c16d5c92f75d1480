/* os.c: the file-system, terminal and process helpers the Lua library needs (run directories,
 * paths, the terminal's width, the ranks `uvmrec launch` starts).  uvmrec_lua.h declares them: they are not part of the engine's C API,
 * but live in libuvmrec so that plain LuaJIT finds them there too. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/core.h"
#include "uvmrec_lua.h"

static int by_string(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

ur_status ur_dir_list(const char *dir, const char *prefix, const char *suffix, char *buf,
                      uint64_t len, uint64_t *needed) {
  UR__ARGS(dir, needed);
  if (len && !buf) return ur__null(__func__, "buf");
  *needed = 1;
  if (len) buf[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return ur__error(UR_STATUS_IO, "dir: cannot list %s: %s", dir, strerror(errno));
  size_t n = 0, cap = 16, pl = prefix ? strlen(prefix) : 0, sl = suffix ? strlen(suffix) : 0;
  char **names = malloc(cap * sizeof *names);
  ur_status s = names ? UR_STATUS_OK : ur__error(UR_STATUS_OOM, "dir: out of host memory");
  struct dirent *ent;
  while (!s && (ent = readdir(d))) {
    const char *nm = ent->d_name;
    size_t l = strlen(nm);
    if (!strcmp(nm, ".") || !strcmp(nm, "..") || strchr(nm, '\n') || l < pl + sl ||
        (pl && memcmp(nm, prefix, pl)) || (sl && memcmp(nm + l - sl, suffix, sl)))
      continue;
    if (n == cap) {
      char **g = realloc(names, 2 * cap * sizeof *names);
      if (!g) {
        s = ur__error(UR_STATUS_OOM, "dir: out of host memory");
        break;
      }
      names = g;
      cap *= 2;
    }
    if (!(names[n] = strdup(nm))) s = ur__error(UR_STATUS_OOM, "dir: out of host memory");
    else n++;
  }
  closedir(d);
  if (!s) {
    qsort(names, n, sizeof *names, by_string);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
      size_t l = strlen(names[i]);
      if (at + l + 2 <= len) {
        memcpy(buf + at, names[i], l);
        buf[at + l] = '\n';
        buf[at + l + 1] = 0;
      }
      at += l + 1;
    }
    *needed = at + 1;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return s;
}

ur_status ur_dir_create(const char *path) {
  UR__ARGS(path);
  if (!path || !*path) return ur__error(UR_STATUS_INVALID, "dir: no path given");
  char *p = strdup(path);
  if (!p) return ur__error(UR_STATUS_OOM, "dir: out of host memory");
  ur_status s = UR_STATUS_OK;
  for (char *c = p + 1; !s; c++) {
    int end = !*c;
    if (*c != '/' && !end) continue;
    *c = 0;
    struct stat sb;
    if (mkdir(p, 0755) && errno != EEXIST)
      s = ur__error(UR_STATUS_IO, "dir: cannot create %s: %s", p, strerror(errno));
    else if (stat(p, &sb) || !S_ISDIR(sb.st_mode))
      s = ur__error(UR_STATUS_IO, "dir: %s exists and is not a directory", p);
    if (end) break;
    *c = '/';
  }
  free(p);
  return s;
}

ur_status ur__sync_dir(const char *path, const char *what) {
  char *dir = strdup(path);
  if (!dir)
    return ur__error(UR_STATUS_OOM, "%s: %s is written, but its directory was not synced: out of "
                     "host memory for a copy of its path (%zu bytes)", what, path, strlen(path) + 1);
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ur_status s = UR_STATUS_OK;
  if (fd < 0 || fsync(fd))
    s = ur__error(UR_STATUS_IO, "%s: %s is written, but syncing its directory %s failed: %s", what,
                  path, dir, strerror(errno));
  if (fd >= 0) close(fd);
  free(dir);
  return s;
}

/* A new file beside path for what will replace it: path.tmp-XXXXXX, a name no other writer has
 * (mkostemp), open for writing in *fd; *tmp (malloc'd) its name. */
static ur_status temp_beside(const char *path, char **tmp, int *fd) {
  size_t n = strlen(path);
  *tmp = malloc(n + 16);
  if (!*tmp) return ur__error(UR_STATUS_OOM, "file: out of host memory");
  snprintf(*tmp, n + 16, "%s.tmp-XXXXXX", path);
  *fd = mkostemp(*tmp, O_CLOEXEC);
  if (*fd >= 0) return UR_STATUS_OK;
  ur_status s = ur__error(UR_STATUS_IO, "file: cannot create %s (a temporary file beside it): %s", path,
                          strerror(errno));
  free(*tmp);
  *tmp = NULL;
  return s;
}

ur_status ur_file_temp(const char *path, char *buf, uint64_t len) {
  UR__ARGS(path, buf);
  if (len < strlen(path) + 12)
    return ur__error(UR_STATUS_INVALID, "file: a buffer of %llu bytes for the temporary name beside %s; "
                     "expected at least %zu", (unsigned long long)len, path, strlen(path) + 12);
  char *tmp;
  int fd;
  ur_status s = temp_beside(path, &tmp, &fd);
  if (s) return s;
  /* 0644, as ur_file_write's */
  if (fchmod(fd, 0644)) s = ur__error(UR_STATUS_IO, "file: setting the mode of %s: %s", tmp, strerror(errno));
  if (close(fd) && !s) s = ur__error(UR_STATUS_IO, "file: closing %s: %s", tmp, strerror(errno));
  if (s) unlink(tmp);
  else snprintf(buf, len, "%s", tmp);
  free(tmp);
  return s;
}

ur_status ur_file_write(const char *path, const void *data, uint64_t len) {
  UR__ARGS(path);
  if (len && !data) return ur__null(__func__, "data");
  char *tmp;
  int fd;
  ur_status s = temp_beside(path, &tmp, &fd);
  if (s) return s;
  const char *p = data;
  for (uint64_t done = 0; done < len && !s;) {
    ssize_t w = write(fd, p + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) s = ur__error(UR_STATUS_IO, "file: writing %s: %s", tmp, w < 0 ? strerror(errno) : "no progress");
    else done += (uint64_t)w;
  }
  /* 0644, as the day files the npy writer makes */
  if (!s && fchmod(fd, 0644)) s = ur__error(UR_STATUS_IO, "file: setting the mode of %s: %s", tmp, strerror(errno));
  if (!s && fsync(fd)) s = ur__error(UR_STATUS_IO, "file: syncing %s: %s", tmp, strerror(errno));
  if (close(fd) && !s) s = ur__error(UR_STATUS_IO, "file: closing %s: %s", tmp, strerror(errno));
  if (!s && rename(tmp, path))
    s = ur__error(UR_STATUS_IO, "file: renaming %s to %s: %s", tmp, path, strerror(errno));
  if (s) unlink(tmp);
  else s = ur__sync_dir(path, "file");
  free(tmp);
  return s;
}

int32_t ur_path_kind(const char *path) {
  UR__ARGS_OR(-1, path);
  struct stat sb;
  if (!path || stat(path, &sb)) return 0;
  return S_ISREG(sb.st_mode) ? 1 : S_ISDIR(sb.st_mode) ? 2 : 3;
}

int32_t ur_term_columns(int32_t fd) {
  if (fd < 0 || !isatty(fd)) return 0;
  struct winsize w;
  /* A pseudo-terminal made without a size (script(1) run from a pipe) reports 0 columns. */
  if (ioctl(fd, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) return 80;
  return w.ws_col;
}

/* ---- processes, for `uvmrec launch` ---- */

ur_status ur_proc_spawn(const char *const *argv, int32_t *pid) {
  UR__ARGS(argv, pid);
  if (!argv || !argv[0]) return ur__error(UR_STATUS_INVALID, "spawn: no program given");
  fflush(stdout);
  fflush(stderr);
  pid_t p = fork();
  if (p < 0) return ur__error(UR_STATUS_IO, "spawn: fork failed: %s", strerror(errno));
  if (p == 0) {
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "spawn: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  *pid = (int32_t)p;
  return UR_STATUS_OK;
}

ur_status ur_proc_wait(int32_t pid, int32_t nohang, int32_t *status, int32_t *which) {
  UR__ARGS(status);
  int ws = 0;
  pid_t got;
  do got = waitpid((pid_t)pid, &ws, nohang ? WNOHANG : 0);
  while (got < 0 && errno == EINTR && !nohang);
  if (got < 0) return ur__error(UR_STATUS_IO, "wait: process %d: %s", (int)pid, strerror(errno));
  if (which) *which = (int32_t)got;
  if (got == 0) *status = -1;
  else if (WIFEXITED(ws)) *status = WEXITSTATUS(ws);
  else *status = 128 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
  return UR_STATUS_OK;
}

ur_status ur_proc_kill(int32_t pid, int32_t sig) {
  if (kill((pid_t)pid, sig) && errno != ESRCH)
    return ur__error(UR_STATUS_IO, "kill: process %d: %s", (int)pid, strerror(errno));
  return UR_STATUS_OK;
}

ur_status ur_env_set(const char *name, const char *value) {
  UR__ARGS(name);
  if (!name || !*name || strchr(name, '='))
    return ur__error(UR_STATUS_INVALID, "env: '%s' is not a variable name", name ? name : "");
  if (value ? setenv(name, value, 1) : unsetenv(name))
    return ur__error(UR_STATUS_IO, "env: cannot set %s: %s", name, strerror(errno));
  return UR_STATUS_OK;
}

int32_t ur_cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int32_t)n : 1;
}

int32_t ur_proc_uid(void) { return (int32_t)geteuid(); }

ur_status ur_dir_temp(char *templ) {
  UR__ARGS(templ);
  if (!templ || !mkdtemp(templ))
    return ur__error(UR_STATUS_IO, "dir: cannot make a temporary folder %s: %s",
                     templ ? templ : "", strerror(errno));
  return UR_STATUS_OK;
}
