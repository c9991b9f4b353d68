/*
 * xburst: start a set of executables all at once and wait for every one of them. For each it
 * prints the time from the first spawn to just before its own posix_spawn, the time to just after
 * its waitpid (CLOCK_MONOTONIC, nanoseconds) and its exit status, so that neither Node's spawn
 * machinery (≈ 1 ms per child, serialised on the caller's event loop) nor its pipes are in the
 * numbers. Used by test/helpers/burst.ts (test/interop/burst.test.ts, bench/burst.ts); built with
 * gcc at run time; not part of the product.
 *
 * usage: xburst OUTDIR STEP [STEP ...]
 *   STEP = BIN STDIN_FILE NENV ENV_1 ... ENV_NENV
 * Step i runs BIN with argv = BIN, exactly the NENV given NAME=value strings as its environment,
 * STDIN_FILE as fd 0, and fds 1 and 2 to OUTDIR/<i>.out and OUTDIR/<i>.err (created 0600), or to
 * /dev/null when OUTDIR is "-". All steps are spawned back to back, then reaped in any order.
 * Output: one line per step, in step order, "<i> <start ns> <end ns> <status>", times relative to
 * the first spawn, status = exit code, or 128 + signal; then "cpu <user ns> <system ns>", the CPU
 * time of all the steps together (getrusage RUSAGE_CHILDREN: every exec and whatever it ran).
 * Exit status 0, or 2 on a usage or spawn error (message on stderr; children already started are
 * still reaped first).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A count at argv[at] whose items must fit before argc; -1 (with a message) if not. */
static long count(char **argv, int at, int argc) {
  char *end = NULL;
  long n = strtol(argv[at], &end, 10);
  if (end == argv[at] || *end != '\0' || n < 0 || at + 1 + n > argc) {
    fprintf(stderr, "xburst: bad count \"%s\" at argument %d\n", argv[at], at);
    return -1;
  }
  return n;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: xburst OUTDIR BIN STDIN_FILE NENV ENV... [STEP...]\n");
    return 2;
  }
  const char *outdir = argv[1];
  /* First pass: count and check the steps. */
  int n = 0;
  for (int i = 2; i < argc; n++) {
    if (i + 2 >= argc) {
      fprintf(stderr, "xburst: incomplete step at argument %d\n", i);
      return 2;
    }
    long nenv = count(argv, i + 2, argc);
    if (nenv < 0) return 2;
    i += 3 + (int)nenv;
  }
  pid_t *pids = calloc((size_t)n, sizeof(pid_t));
  long long *start = calloc((size_t)n, sizeof(long long));
  long long *end = calloc((size_t)n, sizeof(long long));
  int *status = calloc((size_t)n, sizeof(int));
  char **envp = calloc((size_t)argc, sizeof(char *));
  if (pids == NULL || start == NULL || end == NULL || status == NULL || envp == NULL) return 2;

  int started = 0, failed = 0;
  long long t0 = now_ns();
  for (int i = 2, k = 0; k < n; k++) {
    char *bin = argv[i];
    char *in = argv[i + 1];
    long nenv = strtol(argv[i + 2], NULL, 10);
    for (long e = 0; e < nenv; e++) envp[e] = argv[i + 3 + e];
    envp[nenv] = NULL;
    i += 3 + (int)nenv;

    char out[4096], err[4096];
    int dev = strcmp(outdir, "-") == 0;
    snprintf(out, sizeof out, "%s/%d.out", outdir, k);
    snprintf(err, sizeof err, "%s/%d.err", outdir, k);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, strcmp(in, "-") == 0 ? "/dev/null" : in, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, dev ? "/dev/null" : out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, dev ? "/dev/null" : err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *args[2] = { bin, NULL };
    start[k] = now_ns() - t0;
    int e = posix_spawn(&pids[k], bin, &fa, NULL, args, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0) {
      fprintf(stderr, "xburst: cannot spawn %s: %s\n", bin, strerror(e));
      failed = 1;
      break;
    }
    started++;
  }
  for (int left = started; left > 0;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, 0);
    if (p < 0) {
      if (errno == EINTR) continue;
      break;
    }
    long long t = now_ns() - t0;
    for (int k = 0; k < started; k++) {
      if (pids[k] == p) {
        end[k] = t;
        status[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        left--;
        break;
      }
    }
  }
  if (failed) return 2;
  for (int k = 0; k < n; k++) printf("%d %lld %lld %d\n", k, start[k], end[k], status[k]);
  struct rusage ru;
  if (getrusage(RUSAGE_CHILDREN, &ru) != 0) memset(&ru, 0, sizeof ru);
  printf("cpu %lld %lld\n", (long long)ru.ru_utime.tv_sec * 1000000000LL + ru.ru_utime.tv_usec * 1000LL,
         (long long)ru.ru_stime.tv_sec * 1000000000LL + ru.ru_stime.tv_usec * 1000LL);
  return 0;
}
