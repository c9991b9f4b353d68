/*
 * ipwarden lab pause program: the process that holds a pod sandbox's namespaces.
 * Written for the lab (no upstream code): exits 0 on SIGINT/SIGTERM, reaps children on SIGCHLD,
 * otherwise sleeps in pause(). Built with `gcc -static -Os` by src/lab/image.ts.
 */
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_chld(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {0}, chld = {0};
  term.sa_handler = on_term;
  chld.sa_handler = on_chld;
  chld.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &chld, NULL) < 0) {
    return 1;
  }
  for (;;) pause();
}
