// Shared between the .cc files of the malleable_tf native library; not part of any interface.
//
// One shared library, built out of tree against the pip wheel, drives TensorFlow's CPU thread
// pools. Python calls its extern "C" functions through ctypes and its ops via tf.load_op_library:
//   attach.cc       MalleableAttach: reaches the pools through an OpKernelContext, once
//   parking.cc      parked threads (mtf_set_parked, mtf_wait_settled, ...) and mtf_shutdown
//   split_width.cc  how many ways kernels split work (mtf_set_split_width)
//   signals.cc      signal handler -> pipe (mtf_install_signal, mtf_signal_fd)
//   poller.cc       the allowance poll thread (mtf_poll_*)
//   gate.cc         the tf.data gate ops (MalleableGateAcquire/Release, mtf_gate_*)
// Each piece of state below is defined in exactly one of them, named next to it.

#ifndef MALLEABLE_TF_NATIVE_INTERNAL_H_
#define MALLEABLE_TF_NATIVE_INTERNAL_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>

namespace tensorflow {
class DeviceBase;
}

namespace mtf_internal __attribute__((visibility("hidden"))) {

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

// parking.cc; attach.cc sets size and schedule.
extern ParkingLot g_lots[2];

// split_width.cc. At attach: keep `device`'s Eigen device table if it has one level per intra-op
// thread. At shutdown: give the table back as TensorFlow built it.
void CaptureSplitWidth(tensorflow::DeviceBase* device, int intra_threads);
void RestoreSplitWidth();

// signals.cc: the pipe signals and the poller write to; -1 until mtf_signal_fd() creates it.
extern int g_pipe[2];

}  // namespace mtf_internal

extern "C" {
int mtf_signal_fd();                     // signals.cc
void mtf_poll_stop();                    // poller.cc
int mtf_gate_set_capacity(int capacity);  // gate.cc
}

#endif  // MALLEABLE_TF_NATIVE_INTERNAL_H_
