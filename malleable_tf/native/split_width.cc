// Split width: parking alone leaves kernels splitting work by the pool size M, so N < M active
// threads run M-way splits with extra hand-offs. TensorFlow keeps one Eigen device per
// parallelism level (DeviceBase::eigen_cpu_devices_, the table tf.data's per-thread max
// parallelism picks from). Pointing the levels above N at the level-N device makes Eigen kernels
// split N ways like a process started with N threads; setting CpuWorkerThreads::num_threads to N
// does the same for kernels that split with Shard(). Both are restored at shutdown. The pool's
// own ParallelFor and NumThreads() still say M (its threads exist), and kernels that size
// per-thread buffers use those, which stay right.
//
// The table is a private member: a TensorFlow whose DeviceBase renames it fails to compile this
// file. The loader then builds the library again with MTF_PARKING_ONLY, where this file is
// stubs (mtf_set_split_width says -2, "no table"): threads are parked, kernels split by M.

#include <algorithm>
#include <mutex>
#include <vector>

#include "internal.h"

#ifdef MTF_PARKING_ONLY

namespace mtf_internal {
void CaptureSplitWidth(tensorflow::DeviceBase*, int) {}
void RestoreSplitWidth() {}
}  // namespace mtf_internal

extern "C" {
int mtf_set_split_width(int, int) { return -2; }
int mtf_split_width() { return 0; }
int mtf_set_onednn_inline(int) { return -2; }
}  // extern "C"

#else  // the split width follows the active threads

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

// oneDNN inline (MALLEABLE_TF_ONEDNN=inline). TensorFlow's oneDNN adapter
// (tsl/util/onednn_threadpool.h) hands each primitive's work to the intra-op pool with
// ScheduleWithHint(fn, k, k + 1) from the calling (inter-op) thread, which then blocks until it
// is done. With one active intra-op thread that is a hand-off to another thread, often on the
// other core, and back, for every primitive, where TensorFlow started with one thread runs the
// primitive in the caller. This forwarder stands in for the pool as kernels reach it through
// CpuWorkerThreads::workers: it reports the pool's own size and thread ids (per-thread buffers
// sized by NumThreads() and indexed by CurrentThreadId() stay right), and only while `one_wide`
// is set does it run such a single-queue schedule from outside the pool in the caller.
class OneWideInline : public tsl::thread::ThreadPoolInterface {
 public:
  OneWideInline(Eigen::ThreadPoolInterface* real, const bool* one_wide)
      : real_(real), one_wide_(one_wide) {}
  void Schedule(std::function<void()> fn) override { real_->Schedule(std::move(fn)); }
  void ScheduleWithHint(std::function<void()> fn, int start, int limit) override {
    if (limit == start + 1 && __atomic_load_n(one_wide_, __ATOMIC_ACQUIRE) &&
        real_->CurrentThreadId() == -1) {
      fn();
      return;
    }
    real_->ScheduleWithHint(std::move(fn), start, limit);
  }
  void Cancel() override { real_->Cancel(); }
  int NumThreads() const override { return real_->NumThreads(); }
  int CurrentThreadId() const override { return real_->CurrentThreadId(); }

 private:
  Eigen::ThreadPoolInterface* real_;
  const bool* one_wide_;
};

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
  tensorflow::thread::ThreadPool* original_pool = nullptr;  // workers as TensorFlow built it
  tensorflow::thread::ThreadPool* inline_pool = nullptr;    // over OneWideInline; never freed
  bool one_wide = false;
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

}  // namespace

namespace mtf_internal {

void CaptureSplitWidth(tensorflow::DeviceBase* device, int intra_threads) {
  std::lock_guard<std::mutex> ls(g_split.mu);
  auto& levels = device->*Get(EigenCpuDevicesTag());
  if (levels.size() == static_cast<size_t>(intra_threads)) {
    g_split.levels = &levels;
    g_split.original = levels;
    g_split.width = intra_threads;
    g_split.workers = const_cast<tensorflow::DeviceBase::CpuWorkerThreads*>(
        device->tensorflow_cpu_worker_threads());
    g_split.original_pool = g_split.workers->workers;
  }
}

void RestoreSplitWidth() {
  std::lock_guard<std::mutex> l(g_split.mu);
  if (g_split.levels != nullptr) {
    g_split.shard_too = false;
    ApplyWidthLocked(static_cast<int>(g_split.original.size()));
    if (g_split.inline_pool != nullptr) {
      __atomic_store_n(&g_split.one_wide, false, __ATOMIC_RELEASE);
      __atomic_store_n(&g_split.workers->workers, g_split.original_pool, __ATOMIC_RELEASE);
    }
  }
}

}  // namespace mtf_internal

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

// oneDNN inline: from the first call on, kernels reach the intra-op pool through OneWideInline
// (a pointer store; both pools live as long as the process), which runs oneDNN's work in the
// calling thread while `one_wide` is set. Returns 0, or -2 where the device was not captured.
int mtf_set_onednn_inline(int one_wide) {
  std::lock_guard<std::mutex> l(g_split.mu);
  if (g_split.workers == nullptr || g_split.original_pool == nullptr) return -2;
  if (g_split.inline_pool == nullptr) {
    g_split.inline_pool = new tensorflow::thread::ThreadPool(
        new OneWideInline(g_split.original_pool->AsEigenThreadPool(), &g_split.one_wide));
  }
  __atomic_store_n(&g_split.one_wide, one_wide != 0, __ATOMIC_RELEASE);
  __atomic_store_n(&g_split.workers->workers, g_split.inline_pool, __ATOMIC_RELEASE);
  return 0;
}

}  // extern "C"

#endif  // MTF_PARKING_ONLY
