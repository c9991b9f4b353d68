/*
 * Why the index's linger ends on the file system's clock (src/store/file/indexed-store.ts, issue 17).
 * A measurement, never part of `npm test`. Build and run (as root or in a writable directory):
 *
 *   gcc -O2 -o /tmp/stamp-lag bench/stamp-lag.c && /tmp/stamp-lag /dev/shm 2000 && /tmp/stamp-lag /var/tmp 2000
 *
 * 1. lag: for 3 s, how far CLOCK_REALTIME_COARSE (what the kernel stamps files with) trails
 *    CLOCK_REALTIME (Date.now()), and the coarse clock's step.
 * 2. wall-clock rule (the index's first linger rule): our change (a temporary file renamed into
 *    place, as an ADD ends), stat DIR → M, wait until CLOCK_REALTIME ≥ M + one tick + 1 ms, then
 *    another writer unlinks a file nobody stat'ed: how often is DIR's (mtime, ctime) unchanged?
 * 3. probe rule (the fix): instead wait until chmod(DIR/lock, its own mode) + lstat gives a ctime
 *    > M; same unlink; how often unchanged (must be 0), and how many probes it took.
 *
 * Measured on the development VM (Linux 6.18, HZ=250, 2 vCPUs): coarse lag up to 7.0 ms (> 5 ms in
 * 49% of samples), step 4 ms; wall-clock rule: tmpfs 981 / 2000 unlinks invisible, ext4 0 / 2000
 * (ext4 stamps DIR's own, fine-grained, ctime on unlink); probe rule: 0 / 5000 on both, every time
 * at the second probe. Run again while bench/index.ts loaded the machine: coarse lag up to 20.5 ms
 * (5 ticks), wall-clock rule 919 / 2000 on tmpfs, probe rule 0 / 2000.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(clockid_t c) {
  struct timespec t;
  clock_gettime(c, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int64_t ts_ns(struct timespec t) { return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec; }

static int64_t dir_stamp(const char *d, struct stat *s) {
  if (stat(d, s) != 0) { perror("stat"); exit(1); }
  int64_t m = ts_ns(s->st_mtim), c = ts_ns(s->st_ctim);
  return m > c ? m : c;
}

static void touch(const char *p) {
  int fd = open(p, O_CREAT | O_WRONLY, 0600);
  if (fd < 0) { perror(p); exit(1); }
  close(fd);
}

/* The file system's clock as the index reads it: chmod the lock to its own mode, read its ctime. */
static int64_t probe(const char *lock) {
  struct stat a;
  if (lstat(lock, &a) != 0 || chmod(lock, a.st_mode & 07777) != 0 || lstat(lock, &a) != 0) { perror(lock); exit(1); }
  return ts_ns(a.st_ctim);
}

static int run(const char *d, int n, int use_probe, int64_t wait_ns, long probes[8]) {
  char p[4096], q[4096], lock[4096];
  snprintf(lock, sizeof lock, "%s/lock", d);
  touch(lock);
  for (int i = 0; i < n; i++) { snprintf(p, sizeof p, "%s/v%d", d, i); touch(p); }
  int invisible = 0;
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/t", d);
    snprintf(q, sizeof q, "%s/last", d);
    touch(p);
    rename(p, q);
    struct stat s, t;
    int64_t m = dir_stamp(d, &s);
    if (use_probe) {
      int k = 0;
      while (probe(lock) <= m) k++;
      probes[k > 7 ? 7 : k]++;
    } else {
      while (now_ns(CLOCK_REALTIME) < m + wait_ns) {}
    }
    snprintf(p, sizeof p, "%s/v%d", d, i);
    unlink(p);
    dir_stamp(d, &t);
    if (ts_ns(t.st_mtim) == ts_ns(s.st_mtim) && ts_ns(t.st_ctim) == ts_ns(s.st_ctim)) invisible++;
  }
  unlink(lock);
  unlink(q);
  return invisible;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s DIR ROUNDS\n", argv[0]); return 2; }
  int n = atoi(argv[2]);
  struct timespec res;
  clock_getres(CLOCK_REALTIME_COARSE, &res);
  int64_t tick = res.tv_nsec;
  int64_t end = now_ns(CLOCK_MONOTONIC) + 3000000000LL, maxlag = 0, last = now_ns(CLOCK_REALTIME_COARSE);
  long samples = 0, over = 0, steps = 0, stepsum = 0;
  while (now_ns(CLOCK_MONOTONIC) < end) {
    int64_t c = now_ns(CLOCK_REALTIME_COARSE), r = now_ns(CLOCK_REALTIME);
    if (r - c > maxlag) maxlag = r - c;
    if (r - c > tick + 1000000) over++;
    if (c != last) { steps++; stepsum += c - last; last = c; }
    samples++;
  }
  printf("coarse clock: resolution %.3f ms, mean step %.3f ms, lag max %.3f ms, > tick + 1 ms in %.1f%% of %ld samples\n",
         tick / 1e6, steps ? stepsum / 1e6 / steps : 0.0, maxlag / 1e6, 100.0 * over / samples, samples);
  char dir[4096];
  long probes[8] = {0};
  snprintf(dir, sizeof dir, "%s/stamp-lag-XXXXXX", argv[1]);
  if (mkdtemp(dir) == NULL) { perror("mkdtemp"); return 1; }
  int a = run(dir, n, 0, tick + 1000000, probes);
  int b = run(dir, n, 1, 0, probes);
  rmdir(dir);
  printf("%s: wall-clock rule (M + tick + 1 ms): %d / %d unlinks invisible; probe rule: %d / %d; probes beyond the first:",
         argv[1], a, n, b, n);
  for (int i = 0; i < 8; i++) printf(" %d%s:%ld", i, i == 7 ? "+" : "", probes[i]);
  printf("\n");
  return 0;
}
