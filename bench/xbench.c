/*
 * xbench: run a sequence of executables one after another and print, for each, the wall time in
 * nanoseconds from just before posix_spawn to just after waitpid (CLOCK_MONOTONIC) and its exit
 * status. Used by bench/fast-path.ts so that the timer does not include Node's spawn machinery
 * (the method of ../shared/reference/fast-path-measurements.md, "Method"). Built with gcc at run
 * time by the bench; not part of the product.
 *
 * usage: xbench STEP [STEP ...]
 *   STEP = BIN STDIN_FILE NARGS ARG_1 ... ARG_NARGS NENV ENV_1 ... ENV_NENV
 * Each step runs BIN with argv = BIN ARG_1 … ARG_NARGS, exactly the NENV given NAME=value strings
 * as its environment, STDIN_FILE as fd 0 ("-" = /dev/null) and /dev/null as fds 1 and 2.
 * Output: one line per step, "<nanoseconds> <status>", status = exit code, or 128 + signal.
 * Exit status 0, or 2 on a usage or spawn error (message on stderr).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Parse a count at argv position `from`-1 whose items must fit before argc; -1 (with a message) if not. */
static long count(const char *text, int from, int argc) {
  char *end = NULL;
  long n = strtol(text, &end, 10);
  if (end == text || *end != '\0' || n < 0 || from + n > argc) {
    fprintf(stderr, "xbench: bad count \"%s\"\n", text);
    return -1;
  }
  return n;
}

int main(int argc, char **argv) {
  int i = 1;
  if (argc < 5) {
    fprintf(stderr, "usage: xbench BIN STDIN_FILE NARGS ARG... NENV ENV... [STEP...]\n");
    return 2;
  }
  while (i < argc) {
    if (i + 2 >= argc) {
      fprintf(stderr, "xbench: incomplete step at argument %d\n", i);
      return 2;
    }
    char *bin = argv[i];
    char *in = argv[i + 1];
    long nargs = count(argv[i + 2], i + 3, argc);
    if (nargs < 0 || i + 3 + nargs >= argc) return 2;
    char **args = calloc((size_t)nargs + 2, sizeof(char *));
    if (args == NULL) return 2;
    args[0] = bin;
    for (long k = 0; k < nargs; k++) args[k + 1] = argv[i + 3 + k];
    int e0 = i + 3 + (int)nargs; /* index of NENV */
    long nenv = count(argv[e0], e0 + 1, argc);
    if (nenv < 0) return 2;
    char **envp = calloc((size_t)nenv + 1, sizeof(char *));
    if (envp == NULL) return 2;
    for (long k = 0; k < nenv; k++) envp[k] = argv[e0 + 1 + k];

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, strcmp(in, "-") == 0 ? "/dev/null" : in, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);

    pid_t pid;
    int st = 0;
    long long t0 = now_ns();
    int e = posix_spawn(&pid, bin, &fa, NULL, args, envp);
    if (e != 0) {
      fprintf(stderr, "xbench: cannot spawn %s: %s\n", bin, strerror(e));
      return 2;
    }
    while (waitpid(pid, &st, 0) < 0) {
    }
    long long t1 = now_ns();
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    free(args);
    int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    printf("%lld %d\n", t1 - t0, status);
    i = e0 + 1 + (int)nenv;
  }
  return 0;
}
