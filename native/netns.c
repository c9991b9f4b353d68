/*
 * ipwarden-netns: read /proc/thread-self/net/fib_trie and if_inet6 inside each pinned network
 * namespace named on the command line, for the kernel evidence (src/node/kernel-evidence.ts
 * readPinnedNamespaces). Node cannot setns(2); this static helper lets the plugin and the daemon
 * do it with nothing but the kernel: no perl, sh or nsenter on the node or in the image (issue 10).
 *
 * Usage: ipwarden-netns FILE...   (needs CAP_SYS_ADMIN: setns(2) into a network namespace)
 *
 * Output, per FILE in argument order (the format parseNetnsDump reads; the same as the perl helper):
 *   "\0F FILE\n"
 *   then either "\0E ERRNO MESSAGE\n"                      (open or setns failed)
 *   or          "\0I INODE\n" "\0P\n" FIB_TRIE_TEXT IF_INET6_TEXT
 *               (plus "\0E 0 if_inet6 in FILE: MESSAGE\n" when if_inet6 exists but cannot be read)
 * ERRNO is the open(2) errno (2 = the pin was deleted meanwhile); a setns or read failure inside is
 * reported as 0 (a gap in the evidence, never "deleted"). The pin is opened with O_NOFOLLOW (a
 * symlink is refused, never followed) and O_NONBLOCK (a FIFO swapped in fails setns instead of
 * hanging). Exit status 0 when every record was written, 1 on a write error, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char out_buf[1 << 16];

/* Append the whole of `path` to `to`; 0 on success, else the errno of the failure. */
static int copy_file(const char *path, FILE *to) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[1 << 15];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return e;
    }
    if (n == 0) break;
    fwrite(buf, 1, (size_t)n, to);
  }
  close(fd);
  return 0;
}

/* One message line: no newline or NUL inside (the record format is line-based). */
static void put_clean(const char *s) {
  for (; *s != '\0'; s++) fputc(*s == '\n' ? ' ' : *s, stdout);
}

static void record(const char *file) {
  fputc('\0', stdout);
  fputs("F ", stdout);
  put_clean(file);
  fputc('\n', stdout);

  int ns = open(file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (ns < 0) {
    int e = errno;
    fprintf(stdout, "%cE %d open ", '\0', e);
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(e));
    return;
  }
  if (setns(ns, CLONE_NEWNET) != 0) {
    int e = errno;
    close(ns);
    fprintf(stdout, "%cE %d setns ", '\0', e == ENOENT ? 0 : e);
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(e));
    return;
  }
  close(ns);
  struct stat st;
  if (stat("/proc/thread-self/net/fib_trie", &st) != 0) {
    int e = errno;
    fprintf(stdout, "%cE 0 fib_trie in ", '\0');
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(e));
    return;
  }
  /* Read fib_trie before announcing the text, so a read failure is an error record, not text. */
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (mem == NULL) {
    fprintf(stdout, "%cE 0 fib_trie in ", '\0');
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(errno));
    return;
  }
  int e = copy_file("/proc/thread-self/net/fib_trie", mem);
  int e6 = e == 0 ? copy_file("/proc/thread-self/net/if_inet6", mem) : 0;
  if (fclose(mem) != 0 && e == 0) e = ENOMEM;
  if (e != 0) {
    free(text);
    fprintf(stdout, "%cE 0 fib_trie in ", '\0');
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(e));
    return;
  }
  fprintf(stdout, "%cI %llu\n%cP\n", '\0', (unsigned long long)st.st_ino, '\0');
  fwrite(text, 1, len, stdout);
  free(text);
  /* A missing if_inet6 is a kernel without IPv6: no addresses, not a gap. */
  if (e6 != 0 && e6 != ENOENT) {
    fprintf(stdout, "%cE 0 if_inet6 in ", '\0');
    put_clean(file);
    fprintf(stdout, ": %s\n", strerror(e6));
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs("usage: ipwarden-netns FILE...\n", stderr);
    return 2;
  }
  setvbuf(stdout, out_buf, _IOFBF, sizeof out_buf);
  for (int i = 1; i < argc; i++) record(argv[i]);
  if (fflush(stdout) != 0 || ferror(stdout)) return 1;
  return 0;
}
