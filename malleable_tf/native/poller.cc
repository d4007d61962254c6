// Allowance poll: a native thread re-reads the affinity mask and the cgroup files (cpuset, CPU
// quota) every few milliseconds and writes a byte to the signal pipe (signals.cc) only when
// their bytes change. A poll costs a few syscalls and never takes the Python GIL, so it can run
// often.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "internal.h"

namespace {

using mtf_internal::g_pipe;

// The allowance poller. Paths are opened here, not passed as descriptors, so that Python can
// never close a descriptor this thread is reading.
struct Poller {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool running = false;
  bool stop = false;
  int interval_us = 0;
  pid_t pid = 0;
  unsigned char code = 0;
  std::vector<int> fds;
  std::string last;        // the bytes seen at the previous poll
  bool have_last = false;
  long polls = 0;
  long wakes = 0;
};

Poller g_poller;

void CloseFdsLocked(Poller* p) {
  for (int fd : p->fds) close(fd);
  p->fds.clear();
}

std::string SnapshotLocked(Poller* p) {
  std::string out;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(p->pid, sizeof(mask), &mask) == 0) {
    out.append(reinterpret_cast<const char*>(&mask), sizeof(mask));
  } else {
    out.append("affinity-error");
  }
  char buf[4096];
  for (int fd : p->fds) {
    out.push_back('\0');
    ssize_t n = pread(fd, buf, sizeof(buf), 0);  // kernfs regenerates the text at offset 0
    if (n >= 0) {
      out.append(buf, static_cast<size_t>(n));
    } else {
      out.append("read-error");
    }
  }
  return out;
}

void PollLoop(Poller* p) {
  std::unique_lock<std::mutex> lock(p->mu);
  while (!p->stop) {
    std::string now = SnapshotLocked(p);
    ++p->polls;
    if (p->have_last && now != p->last && g_pipe[1] >= 0) {
      ++p->wakes;
      ssize_t ignored = write(g_pipe[1], &p->code, 1);
      (void)ignored;
    }
    p->last.swap(now);
    p->have_last = true;
    p->cv.wait_for(lock, std::chrono::microseconds(p->interval_us), [p] { return p->stop; });
  }
}

}  // namespace

extern "C" {

// Watch `paths` (NUL-separated, `len` bytes) and the affinity of `pid`. Replaces the previous
// set; the next poll takes a fresh baseline. Returns how many paths could be opened.
int mtf_poll_set_paths(const char* paths, int len) {
  std::vector<int> fds;
  std::string all(paths, len > 0 ? static_cast<size_t>(len) : 0);
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    std::string path = all.substr(start, end - start);
    if (!path.empty()) {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) fds.push_back(fd);
    }
    start = end + 1;
  }
  std::lock_guard<std::mutex> l(g_poller.mu);
  CloseFdsLocked(&g_poller);
  g_poller.fds = fds;
  g_poller.have_last = false;
  return static_cast<int>(fds.size());
}

// Start the poll thread: every `interval_us`, a change writes byte `code` to the signal pipe.
// Returns 0, -EALREADY when running, -EINVAL for a bad argument, -EIO without a pipe.
int mtf_poll_start(int interval_us, int pid, int code) {
  if (interval_us < 100 || interval_us > 60000000 || pid <= 0 || code < 0 || code > 255) {
    return -EINVAL;
  }
  if (mtf_signal_fd() < 0) return -EIO;
  std::lock_guard<std::mutex> l(g_poller.mu);
  if (g_poller.running) return -EALREADY;
  g_poller.interval_us = interval_us;
  g_poller.pid = pid;
  g_poller.code = static_cast<unsigned char>(code);
  g_poller.stop = false;
  g_poller.have_last = false;
  g_poller.running = true;
  g_poller.thread = std::thread(PollLoop, &g_poller);
  return 0;
}

void mtf_poll_stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> l(g_poller.mu);
    if (!g_poller.running) return;
    g_poller.stop = true;
    g_poller.running = false;
    g_poller.cv.notify_all();
    t.swap(g_poller.thread);
  }
  t.join();
  std::lock_guard<std::mutex> l(g_poller.mu);
  CloseFdsLocked(&g_poller);
}

// Polls done and wakes sent since load: for tests and benchmarks.
long mtf_poll_count(int which) {
  std::lock_guard<std::mutex> l(g_poller.mu);
  return which == 0 ? g_poller.polls : g_poller.wakes;
}

}  // extern "C"
