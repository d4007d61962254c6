// Thread parking for TensorFlow's CPU thread pools, built out of tree against the pip wheel.
//
// TensorFlow sizes its intra-op and inter-op pools once. To run with fewer threads we "park"
// some of them: a parker is a closure scheduled into the pool that blocks its worker thread on a
// condition variable until it is released, so only size - parked threads run compute. Python
// drives it through the extern "C" functions below (ctypes); one TensorFlow op, MalleableAttach,
// runs once to reach the pools through an OpKernelContext.
//
// Signals: a C-level handler writes one byte per signal to a pipe, so a watcher thread wakes at
// once even while the Python main thread is inside a training step.
//
// Split width: parking alone leaves kernels splitting work by the pool size M, so N < M active
// threads run M-way splits with extra hand-offs. TensorFlow keeps one Eigen device per
// parallelism level (DeviceBase::eigen_cpu_devices_, the table tf.data's per-thread max
// parallelism picks from). Pointing the levels above N at the level-N device makes Eigen kernels
// split N ways like a process started with N threads; setting CpuWorkerThreads::num_threads to N
// does the same for kernels that split with Shard(). Both are restored at shutdown. The pool's
// own ParallelFor and NumThreads() still say M (its threads exist), and kernels that size
// per-thread buffers use those, which stay right.
//
// Input pipeline gate: tf.data runs map functions on threads of its own (not in the two pools),
// so parking cannot limit them. A gated map function takes a ticket first (MalleableGateAcquire,
// blocking while `capacity` calls hold one) and returns it at its end (MalleableGateRelease).
// The ticket is a variant tensor whose last copy returns it if the function fails half-way.
//
// Allowance poll: a native thread re-reads the affinity mask and the cgroup files (cpuset, CPU
// quota) every few milliseconds and writes a byte to the same pipe only when their bytes change.
// A poll costs a few syscalls and never takes the Python GIL, so it can run often.

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <sched.h>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_tensor_data.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

constexpr int kIntra = 0;
constexpr int kInter = 1;

struct ParkingLot {
  std::mutex mu;
  std::condition_variable cv;
  std::function<void(std::function<void()>)> schedule;  // set once at attach
  int size = 0;            // threads in the pool
  int target = 0;          // parkers wanted
  int scheduled = 0;       // parkers scheduled and not yet returned (queued or blocking)
  int parked = 0;          // parkers currently blocking a thread
  bool shutdown = false;   // release everything, for good (process exit)
  std::set<long> parked_tids;  // for tests and telemetry: which threads are held
};

ParkingLot g_lots[2];
std::mutex g_attach_mu;
bool g_attached = false;

// Reading a private member through an explicit instantiation (which skips access checks): the
// layout is the one of the headers this file is compiled against, the installed wheel's.
template <typename Tag, typename Tag::type Member>
struct PrivateAccess {
  friend typename Tag::type Get(Tag) { return Member; }
};
struct EigenCpuDevicesTag {
  using type = std::vector<Eigen::ThreadPoolDevice*> tensorflow::DeviceBase::*;
  friend type Get(EigenCpuDevicesTag);
};
template struct PrivateAccess<EigenCpuDevicesTag, &tensorflow::DeviceBase::eigen_cpu_devices_>;

struct SplitWidth {
  std::mutex mu;
  std::vector<Eigen::ThreadPoolDevice*>* levels = nullptr;   // the device's table, live
  std::vector<Eigen::ThreadPoolDevice*> original;            // as TensorFlow built it
  tensorflow::DeviceBase::CpuWorkerThreads* workers = nullptr;  // Shard()'s thread count
  bool shard_too = false;  // also set the count Shard() splits by
  int width = 0;
};

SplitWidth g_split;

// Level k (1-based) uses the device of level min(k, n). Pointer-sized aligned stores: a kernel
// that reads the table meanwhile gets the old or the new device, both alive for the process.
void ApplyWidthLocked(int n) {
  if (g_split.levels == nullptr) return;
  for (size_t k = 1; k <= g_split.original.size(); ++k) {
    Eigen::ThreadPoolDevice* d = g_split.original[std::min<size_t>(k, n) - 1];
    __atomic_store_n(&(*g_split.levels)[k - 1], d, __ATOMIC_RELEASE);
  }
  if (g_split.workers != nullptr) {
    __atomic_store_n(&g_split.workers->num_threads, g_split.shard_too ? n :
                     static_cast<int>(g_split.original.size()), __ATOMIC_RELEASE);
  }
  g_split.width = n;
}

bool ExcessLocked(ParkingLot* lot) { return lot->shutdown || lot->scheduled > lot->target; }

void Park(ParkingLot* lot) {
  std::unique_lock<std::mutex> lock(lot->mu);
  if (ExcessLocked(lot)) {  // released before it got a thread: leave at once
    --lot->scheduled;
    lot->cv.notify_all();
    return;
  }
  ++lot->parked;
  long tid = syscall(SYS_gettid);
  lot->parked_tids.insert(tid);
  lot->cv.notify_all();
  // Each waiter re-checks under the lock, so exactly scheduled - target parkers leave.
  lot->cv.wait(lock, [lot] { return ExcessLocked(lot); });
  --lot->parked;
  --lot->scheduled;
  lot->parked_tids.erase(tid);
  lot->cv.notify_all();
}

// Signal plumbing: async-signal-safe handler -> pipe.
int g_pipe[2] = {-1, -1};
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

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int capacity = 0;        // 0: no limit (before the runtime sets one, and after shutdown)
  int in_use = 0;
  int max_in_use = 0;      // since the last mtf_gate_reset_max: for tests and benchmarks
  long acquired = 0;
};

Gate g_gate;

void GateAcquire() {
  std::unique_lock<std::mutex> lock(g_gate.mu);
  g_gate.cv.wait(lock, [] { return g_gate.capacity == 0 || g_gate.in_use < g_gate.capacity; });
  ++g_gate.in_use;
  ++g_gate.acquired;
  g_gate.max_in_use = std::max(g_gate.max_in_use, g_gate.in_use);
}

void GateRelease() {
  std::lock_guard<std::mutex> lock(g_gate.mu);
  --g_gate.in_use;
  g_gate.cv.notify_all();
}

// Returns its slot once, from an explicit release or from the destructor of the last copy.
struct TicketSlot {
  std::atomic<bool> held{true};
  void Release() {
    if (held.exchange(false)) GateRelease();
  }
  ~TicketSlot() { Release(); }
};

}  // namespace

// The variant value carried between the two gate ops (inside one map function call; never
// serialized).
struct MalleableGateTicket {
  std::shared_ptr<TicketSlot> slot;
  std::string TypeName() const { return "MalleableGateTicket"; }
  void Encode(tensorflow::VariantTensorData* data) const {}
  bool Decode(const tensorflow::VariantTensorData& data) { return false; }
  std::string DebugString() const { return "MalleableGateTicket"; }
};

extern "C" {

// New Eigen kernels split their work `n` ways (1..pool size), and with `shard_too` also the
// kernels that split by CpuWorkerThreads::num_threads (Shard()). Returns 0, -2 where the
// device's table was not found (before attach, or a TensorFlow that builds it otherwise), -3 out
// of range.
int mtf_set_split_width(int n, int shard_too) {
  std::lock_guard<std::mutex> l(g_split.mu);
  if (g_split.levels == nullptr) return -2;
  if (n < 1 || static_cast<size_t>(n) > g_split.original.size()) return -3;
  g_split.shard_too = shard_too != 0;
  ApplyWidthLocked(n);
  return 0;
}

int mtf_split_width() {
  std::lock_guard<std::mutex> l(g_split.mu);
  return g_split.width;
}

// Calls of gated map functions allowed at once; 0 removes the limit. Wakes waiters to re-check.
int mtf_gate_set_capacity(int capacity) {
  if (capacity < 0) return -EINVAL;
  std::lock_guard<std::mutex> lock(g_gate.mu);
  g_gate.capacity = capacity;
  g_gate.cv.notify_all();
  return 0;
}

// which: 0 capacity, 1 in use now, 2 most in use since the last reset, 3 tickets ever taken.
long mtf_gate_stat(int which) {
  std::lock_guard<std::mutex> lock(g_gate.mu);
  switch (which) {
    case 0: return g_gate.capacity;
    case 1: return g_gate.in_use;
    case 2: return g_gate.max_in_use;
    case 3: return g_gate.acquired;
    default: return -1;
  }
}

void mtf_gate_reset_max() {
  std::lock_guard<std::mutex> lock(g_gate.mu);
  g_gate.max_in_use = g_gate.in_use;
}

int mtf_attached() {
  std::lock_guard<std::mutex> l(g_attach_mu);
  return g_attached ? 1 : 0;
}

int mtf_pool_size(int pool) {
  if (pool != kIntra && pool != kInter) return -1;
  std::lock_guard<std::mutex> l(g_lots[pool].mu);
  return g_lots[pool].size;
}

// Ask for `n` parked threads. Returns 0, or -1 for a bad pool, -2 before attach, -3 when n is
// out of [0, size-1] (a pool never has all its threads parked), -4 after shutdown.
int mtf_set_parked(int pool, int n) {
  if (pool != kIntra && pool != kInter) return -1;
  ParkingLot* lot = &g_lots[pool];
  int to_schedule = 0;
  {
    std::lock_guard<std::mutex> l(lot->mu);
    if (!lot->schedule) return -2;
    if (lot->shutdown) return -4;
    if (n < 0 || n > lot->size - 1) return -3;
    lot->target = n;
    to_schedule = std::max(0, n - lot->scheduled);
    lot->scheduled += to_schedule;
    lot->cv.notify_all();
  }
  for (int i = 0; i < to_schedule; ++i) lot->schedule([lot] { Park(lot); });
  return 0;
}

int mtf_parked(int pool) {
  if (pool != kIntra && pool != kInter) return -1;
  std::lock_guard<std::mutex> l(g_lots[pool].mu);
  return g_lots[pool].parked;
}

// Copies up to `n` ids of parked threads into `out`; returns how many were copied.
int mtf_parked_tids(int pool, long* out, int n) {
  if (pool != kIntra && pool != kInter) return -1;
  std::lock_guard<std::mutex> l(g_lots[pool].mu);
  int i = 0;
  for (long tid : g_lots[pool].parked_tids) {
    if (i >= n) break;
    out[i++] = tid;
  }
  return i;
}

int mtf_target(int pool) {
  if (pool != kIntra && pool != kInter) return -1;
  std::lock_guard<std::mutex> l(g_lots[pool].mu);
  return g_lots[pool].target;
}

// Wait until the parked count equals the target. Returns the parked count at return.
int mtf_wait_settled(int pool, int timeout_ms) {
  if (pool != kIntra && pool != kInter) return -1;
  ParkingLot* lot = &g_lots[pool];
  std::unique_lock<std::mutex> lock(lot->mu);
  lot->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                   [lot] { return lot->parked == lot->target || lot->shutdown; });
  return lot->parked;
}

int mtf_signal_fd();

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

// Release every parked thread for good: called at exit, so that TensorFlow can join its pools.
void mtf_shutdown() {
  mtf_poll_stop();
  mtf_gate_set_capacity(0);  // nothing may wait at the gate while the process exits
  {
    // TensorFlow deletes every entry of its table when the device goes: give it back as built.
    std::lock_guard<std::mutex> l(g_split.mu);
    if (g_split.levels != nullptr) {
      g_split.shard_too = false;
      ApplyWidthLocked(static_cast<int>(g_split.original.size()));
    }
  }
  for (ParkingLot& lot : g_lots) {
    std::unique_lock<std::mutex> lock(lot.mu);
    lot.shutdown = true;
    lot.target = 0;
    lot.cv.notify_all();
    lot.cv.wait_for(lock, std::chrono::seconds(5), [&lot] { return lot.parked == 0; });
  }
}

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

namespace tensorflow {

REGISTER_OP("MalleableAttach")
    .Attr("inter_op_threads: int")
    .Output("intra_op_threads: int32")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return OkStatus();
    });

// Captures the intra-op pool and the inter-op runner of the context it runs in (eager: the
// process-wide pools), so that Python can park their threads later from any thread.
class MalleableAttachOp : public OpKernel {
 public:
  explicit MalleableAttachOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("inter_op_threads", &inter_threads_));
  }

  void Compute(OpKernelContext* ctx) override {
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    OP_REQUIRES(ctx, workers != nullptr && workers->workers != nullptr,
                errors::FailedPrecondition("no CPU worker threads on this device"));
    thread::ThreadPool* intra = workers->workers;
    {
      std::lock_guard<std::mutex> l(g_attach_mu);
      if (!g_attached) {
        {
          std::lock_guard<std::mutex> li(g_lots[kIntra].mu);
          g_lots[kIntra].size = intra->NumThreads();
          g_lots[kIntra].schedule = [intra](std::function<void()> fn) {
            intra->Schedule(std::move(fn));
          };
        }
        {
          std::lock_guard<std::mutex> ls(g_split.mu);
          auto& levels = ctx->device()->*Get(EigenCpuDevicesTag());
          if (levels.size() == static_cast<size_t>(intra->NumThreads())) {
            g_split.levels = &levels;
            g_split.original = levels;
            g_split.width = intra->NumThreads();
            g_split.workers = const_cast<DeviceBase::CpuWorkerThreads*>(workers);
          }
        }
        auto* runner = ctx->runner();
        if (runner != nullptr && *runner) {
          std::lock_guard<std::mutex> lo(g_lots[kInter].mu);
          g_lots[kInter].size = inter_threads_;
          g_lots[kInter].schedule = *runner;
        }
        g_attached = true;
      }
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32>()() = intra->NumThreads();
  }

 private:
  int inter_threads_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("MalleableAttach").Device(DEVICE_CPU), MalleableAttachOp);

REGISTER_OP("MalleableGateAcquire")
    .Output("ticket: variant")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("MalleableGateRelease")
    .Input("ticket: variant")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// Blocks the calling thread (one of tf.data's) until the gate has room.
class MalleableGateAcquireOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    GateAcquire();
    MalleableGateTicket ticket{std::make_shared<TicketSlot>()};
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<Variant>()() = std::move(ticket);
  }
};

class MalleableGateReleaseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const auto* ticket = ctx->input(0).scalar<Variant>()().get<MalleableGateTicket>();
    OP_REQUIRES(ctx, ticket != nullptr && ticket->slot != nullptr,
                errors::InvalidArgument("MalleableGateRelease wants a MalleableGateAcquire ticket"));
    ticket->slot->Release();
  }
};

REGISTER_KERNEL_BUILDER(Name("MalleableGateAcquire").Device(DEVICE_CPU), MalleableGateAcquireOp);
REGISTER_KERNEL_BUILDER(Name("MalleableGateRelease").Device(DEVICE_CPU), MalleableGateReleaseOp);

}  // namespace tensorflow
