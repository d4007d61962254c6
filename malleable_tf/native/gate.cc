// Input pipeline gate: tf.data runs map functions on threads of its own (not in the two pools),
// so parking cannot limit them. A gated map function takes a ticket first (MalleableGateAcquire,
// blocking while `capacity` calls hold one) and returns it at its end (MalleableGateRelease).
// The ticket is a variant tensor whose last copy returns it if the function fails half-way.

#include <errno.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "internal.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_tensor_data.h"

namespace {

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

}  // extern "C"

namespace tensorflow {

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
