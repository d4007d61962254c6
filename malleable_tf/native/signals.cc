// Signals: a C-level handler writes one byte per signal to a pipe, so a watcher thread wakes at
// once even while the Python main thread is inside a training step. The allowance poller
// (poller.cc) writes to the same pipe.

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "internal.h"

namespace mtf_internal {

int g_pipe[2] = {-1, -1};

}  // namespace mtf_internal

namespace {

using mtf_internal::g_pipe;

// Signal plumbing: async-signal-safe handler -> pipe.
unsigned char g_signal_code[65];
struct sigaction g_old_actions[65];
bool g_installed[65];

void OnSignal(int signo) {
  int saved = errno;
  if (signo > 0 && signo < 65 && g_pipe[1] >= 0) {
    unsigned char code = g_signal_code[signo];
    ssize_t ignored = write(g_pipe[1], &code, 1);  // full pipe: drop, a poll follows anyway
    (void)ignored;
  }
  errno = saved;
}

}  // namespace

extern "C" {

int mtf_signal_fd() {
  if (g_pipe[0] < 0) {
    if (pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  }
  return g_pipe[0];
}

// Route `signo` to the pipe as byte `code`. Returns 0 or -errno.
int mtf_install_signal(int signo, int code) {
  if (signo <= 0 || signo >= 65 || code < 0 || code > 255) return -EINVAL;
  if (mtf_signal_fd() < 0) return -EIO;
  g_signal_code[signo] = static_cast<unsigned char>(code);
  struct sigaction sa;
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  struct sigaction old;
  if (sigaction(signo, &sa, &old) != 0) return -errno;
  if (!g_installed[signo]) g_old_actions[signo] = old;
  g_installed[signo] = true;
  return 0;
}

int mtf_uninstall_signal(int signo) {
  if (signo <= 0 || signo >= 65 || !g_installed[signo]) return -EINVAL;
  if (sigaction(signo, &g_old_actions[signo], nullptr) != 0) return -errno;
  g_installed[signo] = false;
  return 0;
}

}  // extern "C"
