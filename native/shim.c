/*
 * ipwarden exec shim (docs/daemon.md): installed as DIR/ipwarden, exec'd by the container runtime
 * once per CNI request. It forwards the request to the resident daemon over a unix socket
 * (protocol v2: the header, the daemon's acknowledgement, then the body) and relays the answer;
 * when the daemon is absent, refuses, closes, does not acknowledge within the short deadline (3 s),
 * answers malformed or does not answer in time (150 s), it runs DIR/ipwarden-standalone (the Node
 * plugin) in this same process with the same stdin bytes. Static, single-threaded, no config file,
 * no variable of its own: the socket path and the two timeouts are patchable fields in this binary.
 * Without CNI_COMMAND it never touches the socket: it runs the standalone as the CLI, and when also
 * given no argument, with IPWARDEN_PATH=plugin-about so that it prints skel's "about" text.
 *
 * Build: gcc -static -O2 -Wall -Wextra -Werror -o dist/ipwarden-shim native/shim.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the protocol is little-endian; this shim writes its integers in host order"
#endif

#define SOCKET_MARKER "IPWARDEN-SOCKET-PATH="
#define TIMEOUT_MARKER "IPWARDEN-SHIM-TIMEOUT="
#define ACK_TIMEOUT_MARKER "IPWARDEN-SHIM-ACK-TIMEOUT="
#define MAX_SOCKET_PATH 107u           /* sun_path holds 108 bytes with the NUL */
#define MAX_ENV_BYTES 65536u           /* protocol limits (docs/daemon.md) */
#define MAX_STDIN_BYTES (16u << 20)
#define MAX_ANSWER_PART (16u << 20)    /* stdout, stderr: each */
#define PROTOCOL_VERSION 2u
#define DEFAULT_TIMEOUT_MS 150000
#define DEFAULT_ACK_TIMEOUT_MS 3000
#define STANDALONE "ipwarden-standalone"

/* Patchable fields (install-cni rewrites them in the copy it writes): marker, value, NUL padding.
 * Not static, so the compiler cannot fold their contents into the code. */
char ipwarden_socket_field[256] = SOCKET_MARKER "/run/ipwarden/plugin.sock";
char ipwarden_timeout_field[32] = TIMEOUT_MARKER "150";
char ipwarden_ack_timeout_field[32] = ACK_TIMEOUT_MARKER "3";

extern char **environ;

static int cli_mode;                   /* no CNI_COMMAND: not a CNI request */

/* Last resort: the runtime gets an error document (CNI mode; indented by 4 spaces, no trailing
 * newline, as skel prints errors) or a line on stderr (CLI mode). */
static void die(const char *what, int err) {
  if (cli_mode) dprintf(2, "ipwarden: %s: %s\n", what, strerror(err));
  else dprintf(1, "{\n    \"cniVersion\": \"1.0.0\",\n    \"code\": 999,\n    \"msg\": \"ipwarden: %s: %s\"\n}", what, strerror(err));
  _exit(1);
}

/* Write all of buf; retries EINTR and partial writes, waits on EAGAIN. 0, or -1 with errno. */
static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { struct pollfd p = { fd, POLLOUT, 0 }; poll(&p, 1, -1); continue; }
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Wait for `events` on fd until the deadline. 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, long long deadline) {
  for (;;) {
    long long left = deadline - now_ms();
    if (left <= 0) return 0;
    struct pollfd p = { fd, events, 0 };
    int r = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r;
    return 1;                           /* readable, writable, or HUP/ERR: the next call tells */
  }
}

/* The value of a patchable field after its marker (m bytes), copied into out (cap bytes); NULL
 * when empty or unterminated. The marker is skipped by length, not compared: its text must occur
 * once in the binary (install-cni finds the field by it). */
static const char *field_value(const char *field, size_t size, size_t m, char *out, size_t cap) {
  const volatile char *f = field;       /* read the bytes as they are in the file */
  for (size_t i = 0; m + i < size && i < cap; i++) {
    out[i] = f[m + i];
    if (out[i] == '\0') return i > 0 ? out : NULL;
  }
  return NULL;
}

/* A timeout in ms from a timeout field (marker of m bytes): decimal seconds, optionally with a
 * fraction ("0.5"); unparsable, empty or zero: dflt. */
static long long timeout_ms(const char *field, size_t size, size_t m, long long dflt) {
  char v[16];
  const char *s = field_value(field, size, m, v, sizeof v);
  long long ms = 0, scale = 1000;
  int frac = 0;
  if (s == NULL) return dflt;
  for (; *s; s++) {
    if (*s == '.' && !frac) { frac = 1; continue; }
    if (*s < '0' || *s > '9' || ms > 86400000LL) return dflt;
    if (!frac) ms = ms * 10 + (*s - '0') * 1000;
    else if (scale > 1) { scale /= 10; ms += (*s - '0') * scale; }
  }
  return ms > 0 ? ms : dflt;
}

/* Send all of msg's iovecs before the deadline (MSG_NOSIGNAL: a closed peer is EPIPE, not a
 * signal). 0, or -1 when the daemon went away, failed or the deadline passed. */
static int send_all(int s, struct msghdr *msg, long long deadline) {
  while (msg->msg_iovlen > 0) {
    ssize_t n = sendmsg(s, msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) { if (wait_fd(s, POLLOUT, deadline) <= 0) return -1; continue; }
    if (n < 0) return -1;             /* EPIPE, ECONNRESET: the daemon went away */
    while (msg->msg_iovlen > 0 && (size_t)n >= msg->msg_iov[0].iov_len) {
      n -= (ssize_t)msg->msg_iov[0].iov_len;
      msg->msg_iov++;
      msg->msg_iovlen--;
    }
    if (msg->msg_iovlen > 0) { msg->msg_iov[0].iov_base = (char *)msg->msg_iov[0].iov_base + n; msg->msg_iov[0].iov_len -= (size_t)n; }
  }
  return 0;
}

/* Receive exactly len bytes into buf before the deadline. 0, or -1 (closed, reset, deadline). */
static int recv_all(int s, char *buf, size_t len, long long deadline) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = recv(s, buf + got, len - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) { if (wait_fd(s, POLLIN, deadline) <= 0) return -1; continue; }
    if (n <= 0) return -1;            /* closed before all of it, or reset */
    got += (size_t)n;
  }
  return 0;
}

static char *no_args[2];               /* argv when the shim was run with argc == 0 */

/* Run DIR/ipwarden-standalone (DIR = directory of /proc/self/exe; without /proc, of an absolute
 * argv[0], which is how runtimes exec plugins) in this process, with argv[0] replaced by its
 * path. No return. */
static void exec_standalone(char **argv, char **envp) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self);
  if (n <= 0 && argv[0] != NULL && argv[0][0] == '/' && strlen(argv[0]) < sizeof self) {
    n = (ssize_t)strlen(argv[0]);
    memcpy(self, argv[0], (size_t)n);
  }
  if (n <= 0) die("cannot run the standalone plugin", errno);
  if ((size_t)n >= sizeof self) die("cannot run the standalone plugin", ENAMETOOLONG);
  char *slash = memrchr(self, '/', (size_t)n);
  if (slash == NULL || (size_t)(slash + 1 - self) + sizeof STANDALONE > sizeof self) die("cannot run the standalone plugin", ENAMETOOLONG);
  memcpy(slash + 1, STANDALONE, sizeof STANDALONE);
  if (argv[0] == NULL) argv = no_args;  /* never drop argv's NULL terminator */
  argv[0] = self;
  execve(self, argv, envp);
  die("cannot run the standalone plugin", errno);
}

/* Fill fd with buf, then (when rest) with what is left on stdin; rewind. 0, or -1 with errno. */
static int fill(int fd, const char *buf, size_t len, int rest, int *consumed) {
  if (write_all(fd, buf, len) < 0) return -1;
  if (rest) {
    char chunk[65536];
    for (;;) {
      ssize_t n = read(0, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) { struct pollfd p = { 0, POLLIN, 0 }; poll(&p, 1, -1); continue; }
      if (n <= 0) break;                /* a read error ends the replay as an end of file would */
      *consumed = 1;
      if (write_all(fd, chunk, (size_t)n) < 0) return -1;
    }
  }
  return lseek(fd, 0, SEEK_SET) == 0 ? 0 : -1;
}

/* Put the stdin bytes read so far (plus the unread rest, when rest) back on fd 0:
 * a memfd, else an O_TMPFILE or unlinked file in /dev/shm, else a pipe when they fit in one. */
static void replay_stdin(const char *buf, size_t len, int rest) {
  int consumed = 0, fd, err = 0;
  for (int how = 0; how < 3 && !consumed; how++) {
    if (how == 0) fd = memfd_create("ipwarden-stdin", MFD_CLOEXEC);
    else if (how == 1) fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    else {
      char name[] = "/dev/shm/ipwarden-stdin-XXXXXX";
      fd = mkostemp(name, O_CLOEXEC);   /* O_EXCL: never opens an existing file or symlink */
      if (fd >= 0) unlink(name);
    }
    if (fd >= 0 && fill(fd, buf, len, rest, &consumed) == 0) {
      if (dup2(fd, 0) < 0) die("cannot replay stdin to the standalone plugin", errno);
      if (fd != 0) close(fd);
      return;
    }
    err = errno;
    if (fd >= 0) close(fd);
  }
  int p[2];
  if (!consumed && !rest && pipe2(p, O_CLOEXEC) == 0) {
    if (len > 65536) fcntl(p[1], F_SETPIPE_SZ, (int)len);
    long size = fcntl(p[1], F_GETPIPE_SZ);
    if (size >= 0 && (size_t)size >= len && write_all(p[1], buf, len) == 0 && dup2(p[0], 0) == 0) {
      close(p[0]);
      close(p[1]);
      return;
    }
    err = size >= 0 && (size_t)size < len ? EFBIG : errno;
  }
  die("cannot replay stdin to the standalone plugin", err ? err : EIO);
}

int main(int argc, char **argv) {
  /* fds 0-2 must be open, so the socket or a replay file never lands on one of them. */
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF && open("/dev/null", O_RDWR) != fd) _exit(1);

  const char *cmd = getenv("CNI_COMMAND");
  if (cmd == NULL || *cmd == '\0') {   /* CLI use (ipwarden gc, ...): same rule as src/main.ts */
    cli_mode = 1;
    if (argc > 1) exec_standalone(argv, environ);
    /* The plugin's path typed alone, no CNI_COMMAND and no argument: like any skel plugin, print
     * the "about" text on stderr and exit 0. The standalone prints it (it knows the versions) when
     * IPWARDEN_PATH is plugin-about; the daemon is not asked. The environment is kept, but any
     * IPWARDEN_PATH of the caller is replaced. */
    size_t n = 0, k = 0;
    while (environ[n]) n++;
    char **about_env = calloc(n + 2, sizeof *about_env);
    if (about_env == NULL) die("cannot run the standalone plugin", ENOMEM);
    for (size_t i = 0; i < n; i++)
      if (strncmp(environ[i], "IPWARDEN_PATH=", 14) != 0) about_env[k++] = environ[i];
    about_env[k] = "IPWARDEN_PATH=plugin-about";
    exec_standalone(argv, about_env);
  }

  /* The forwarded environment: CNI_*, CONTAINER_RUNTIME_ENDPOINT and PATH; nothing else. Room
   * for the two fallback variables and the NULL. */
  size_t count = 0, env_bytes = 0, kept = 0;
  while (environ[count]) count++;
  char **env = calloc(count + 3, sizeof *env);
  if (env == NULL) die("cannot run the standalone plugin", ENOMEM);
  for (size_t i = 0; i < count; i++) {
    const char *e = environ[i];
    if (strchr(e, '=') == NULL) continue;
    if (strncmp(e, "CNI_", 4) && strncmp(e, "CONTAINER_RUNTIME_ENDPOINT=", 27) && strncmp(e, "PATH=", 5)) continue;
    env[kept++] = environ[i];
    if (env_bytes <= MAX_ENV_BYTES) env_bytes += strlen(e) + 1;
  }

  char sock_path[MAX_SOCKET_PATH + 1];
  const char *sock = field_value(ipwarden_socket_field, sizeof ipwarden_socket_field, sizeof SOCKET_MARKER - 1, sock_path, sizeof sock_path);
  if (sock != NULL && sock[0] != '/') sock = NULL;
  /* On fallback the standalone learns that it is one and where the socket is (for the counting
   * line, docs/daemon.md); storage for IPWARDEN_SOCKET=<path>. */
  static char sock_var[sizeof "IPWARDEN_SOCKET=" + MAX_SOCKET_PATH];
  env[kept] = "IPWARDEN_PATH=standalone-fallback";
  if (sock != NULL) {
    snprintf(sock_var, sizeof sock_var, "IPWARDEN_SOCKET=%s", sock);
    env[kept + 1] = sock_var;
  }

  /* Connect first: with the daemon down, the standalone gets the untouched stdin (no replay). */
  int s = -1;
  if (sock != NULL && env_bytes <= MAX_ENV_BYTES) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    memcpy(a.sun_path, sock, strlen(sock) + 1);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) < 0) { close(s); s = -1; }
    /* Only a daemon of our own user (root) may answer for the plugin: whoever could create the
     * socket path (a writable parent directory) must not choose pods' addresses. The listener's
     * credentials are those it had at listen(2) (SO_PEERCRED); anything else: the standalone. */
    if (s >= 0) {
      struct ucred cred;
      socklen_t cl = sizeof cred;
      if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 || cl != sizeof cred || cred.uid != geteuid()) { close(s); s = -1; }
    }
  }
  if (s < 0) exec_standalone(argv, env);

  /* Read all of stdin, at most MAX_STDIN_BYTES + 1 bytes (one more: "too large"). */
  size_t cap = 65536, len = 0;
  char *in = malloc(cap);
  int over = in == NULL, failed = 0;
  while (!over && !failed) {
    if (len == cap) {
      size_t want = cap * 2 > MAX_STDIN_BYTES + 1 ? MAX_STDIN_BYTES + 1 : cap * 2;
      char *bigger = want > cap ? realloc(in, want) : NULL;
      if (bigger == NULL) { over = 1; break; }  /* no memory: the standalone reads it */
      in = bigger;
      cap = want;
    }
    ssize_t n = read(0, in + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) { struct pollfd p = { 0, POLLIN, 0 }; poll(&p, 1, -1); continue; }
    if (n < 0) failed = 1;
    else if (n == 0) break;
    else if ((len += (size_t)n) > MAX_STDIN_BYTES) over = 1;
  }
  if (failed && len == 0) { close(s); exec_standalone(argv, env); }  /* it meets the same error */
  if (over || failed) { close(s); replay_stdin(in, len, over); exec_standalone(argv, env); }

  /* Protocol v2 (docs/daemon.md): the header "IPWD" 2 pid envBytes stdinBytes; the daemon's
   * acknowledgement "IPWA" 2 within the short deadline; only then the body (env block, stdin),
   * and the answer within the long one. Both deadlines count from here. A daemon that does not
   * acknowledge in time (stopped, hung, its event loop blocked) never gets the body: when it
   * wakes it finds a header and an end of stream, and cannot run the request the standalone runs
   * now. An old daemon that speaks only v1 closes at once: the standalone, at once. */
  char *block = malloc(env_bytes + 1), *p = block;
  if (block == NULL) goto fallback;
  for (size_t i = 0; i < kept; i++) { size_t l = strlen(env[i]) + 1; memcpy(p, env[i], l); p += l; }
  uint32_t head[5] = { 0, PROTOCOL_VERSION, (uint32_t)getpid(), (uint32_t)env_bytes, (uint32_t)len };
  memcpy(head, "IPWD", 4);              /* host order = little-endian (checked above) */
  long long start = now_ms();
  long long deadline = start + timeout_ms(ipwarden_timeout_field, sizeof ipwarden_timeout_field, sizeof TIMEOUT_MARKER - 1, DEFAULT_TIMEOUT_MS);
  long long ack_deadline = start + timeout_ms(ipwarden_ack_timeout_field, sizeof ipwarden_ack_timeout_field, sizeof ACK_TIMEOUT_MARKER - 1, DEFAULT_ACK_TIMEOUT_MS);
  if (ack_deadline > deadline) ack_deadline = deadline;
  struct iovec hiov[1] = { { head, sizeof head } };
  struct msghdr hmsg = { .msg_iov = hiov, .msg_iovlen = 1 };
  if (send_all(s, &hmsg, ack_deadline) < 0) goto fallback;
  uint32_t ack[2];
  if (recv_all(s, (char *)ack, sizeof ack, ack_deadline) < 0) goto fallback;
  if (memcmp(ack, "IPWA", 4) != 0 || ack[1] != PROTOCOL_VERSION) goto fallback;
  /* Acknowledged: from here the daemon may run the request, so the shim waits for its answer (or
   * its close) until the long deadline; it never falls back because the daemon is slow. */
  struct iovec iov[2] = { { block, env_bytes }, { in, len } };
  struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 2 };
  if (send_all(s, &msg, deadline) < 0) goto fallback;

  /* Answer: "IPWD" 2 exitStatus stdoutBytes stderrBytes | stdout | stderr. The header is
   * checked before the body is allocated. */
  uint32_t ans[5];
  if (recv_all(s, (char *)ans, sizeof ans, deadline) < 0) goto fallback;
  if (memcmp(ans, "IPWD", 4) != 0 || ans[1] != PROTOCOL_VERSION || ans[2] > 255 || ans[3] > MAX_ANSWER_PART || ans[4] > MAX_ANSWER_PART) goto fallback;
  size_t body_len = (size_t)ans[3] + ans[4];
  char *body = malloc(body_len + 1);
  if (body == NULL) goto fallback;
  if (recv_all(s, body, body_len, deadline) < 0) goto fallback;
  close(s);
  write_all(1, body, ans[3]);          /* nothing more to do if the runtime closed its pipes */
  write_all(2, body + ans[3], ans[4]);
  _exit((int)ans[2]);

fallback:
  close(s);
  replay_stdin(in, len, 0);
  exec_standalone(argv, env);
  return 1;
}
