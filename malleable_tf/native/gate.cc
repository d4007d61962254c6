// Input pipeline gate: tf.data runs map functions on threads of its own (not in the two pools),
// so parking cannot limit them. A gated map function takes a ticket first (MalleableGateAcquire,
// waiting while `capacity` calls hold one) and returns it at its end (MalleableGateRelease).
// The ticket is a variant tensor whose last copy returns it if the function fails half-way.
//
// Acquire is asynchronous: a call that must wait is queued and holds no thread (TensorFlow's
// op_kernel.h: a synchronous kernel must not block on another kernel, the pool that would run
// it may be all blocked). A release or a new capacity admits the queued calls in order; a
// cancelled call (its iterator deleted) leaves the queue at once with a Cancelled status.

#include <errno.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "internal.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_tensor_data.h"

namespace {

// One Acquire call that could not take a ticket at once. Guarded by g_gate.mu.
struct Waiter {
  enum class State { kNew, kQueued, kCancelled, kDone };
  tensorflow::OpKernelContext* ctx;
  tensorflow::AsyncOpKernel::DoneCallback done;
  tensorflow::CancellationManager* cm = nullptr;
  tensorflow::CancellationToken token = tensorflow::CancellationManager::kInvalidToken;
  State state = State::kNew;
};

struct Gate {
  std::mutex mu;
  int capacity = 0;        // 0: no limit (before the runtime sets one, and after shutdown)
  int in_use = 0;
  int max_in_use = 0;      // since the last mtf_gate_reset_max: for tests and benchmarks
  long acquired = 0;
  std::deque<std::shared_ptr<Waiter>> queue;   // in arrival order
};

Gate g_gate;

bool HasRoom() { return g_gate.capacity == 0 || g_gate.in_use < g_gate.capacity; }

void TakeTicket() {
  ++g_gate.in_use;
  ++g_gate.acquired;
  g_gate.max_in_use = std::max(g_gate.max_in_use, g_gate.in_use);
}

// With g_gate.mu held: the queued calls there is room for now, their tickets taken.
std::vector<std::shared_ptr<Waiter>> AdmitLocked() {
  std::vector<std::shared_ptr<Waiter>> admitted;
  while (!g_gate.queue.empty() && HasRoom()) {
    std::shared_ptr<Waiter> w = std::move(g_gate.queue.front());
    g_gate.queue.pop_front();
    w->state = Waiter::State::kDone;
    TakeTicket();
    admitted.push_back(std::move(w));
  }
  return admitted;
}

void Grant(tensorflow::OpKernelContext* ctx, const tensorflow::AsyncOpKernel::DoneCallback& done);

// Without g_gate.mu: each admitted call gets its ticket and goes on.
void Finish(std::vector<std::shared_ptr<Waiter>> admitted) {
  for (auto& w : admitted) {
    // Its cancellation callback may still run (it then finds kDone and does nothing).
    if (w->cm != nullptr) w->cm->TryDeregisterCallback(w->token);
    Grant(w->ctx, w->done);
  }
}

void GateRelease() {
  std::vector<std::shared_ptr<Waiter>> admitted;
  {
    std::lock_guard<std::mutex> lock(g_gate.mu);
    --g_gate.in_use;
    admitted = AdmitLocked();
  }
  Finish(std::move(admitted));
}

// The call's iterator (or function) was cancelled while it waited: it leaves the queue.
void CancelWaiter(const std::shared_ptr<Waiter>& w) {
  {
    std::lock_guard<std::mutex> lock(g_gate.mu);
    if (w->state == Waiter::State::kNew) {     // not queued yet: the caller sees this
      w->state = Waiter::State::kCancelled;
      return;
    }
    if (w->state != Waiter::State::kQueued) return;
    auto& q = g_gate.queue;
    q.erase(std::remove(q.begin(), q.end(), w), q.end());
    w->state = Waiter::State::kDone;
  }
  w->ctx->SetStatus(tensorflow::errors::Cancelled("MalleableGateAcquire: cancelled while "
                                                  "waiting for the gate"));
  w->done();
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

// Calls of gated map functions allowed at once; 0 removes the limit. Admits queued calls there
// is room for now.
int mtf_gate_set_capacity(int capacity) {
  if (capacity < 0) return -EINVAL;
  std::vector<std::shared_ptr<Waiter>> admitted;
  {
    std::lock_guard<std::mutex> lock(g_gate.mu);
    g_gate.capacity = capacity;
    admitted = AdmitLocked();
  }
  Finish(std::move(admitted));
  return 0;
}

// which: 0 capacity, 1 in use now, 2 most in use since the last reset, 3 tickets ever taken,
// 4 calls waiting now.
long mtf_gate_stat(int which) {
  std::lock_guard<std::mutex> lock(g_gate.mu);
  switch (which) {
    case 0: return g_gate.capacity;
    case 1: return g_gate.in_use;
    case 2: return g_gate.max_in_use;
    case 3: return g_gate.acquired;
    case 4: return static_cast<long>(g_gate.queue.size());
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

// Takes a ticket, or queues the call (no thread held) until a release or a new capacity admits
// it, or its cancellation manager cancels it.
class MalleableGateAcquireOp : public AsyncOpKernel {
 public:
  using AsyncOpKernel::AsyncOpKernel;
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto w = std::make_shared<Waiter>();
    w->ctx = ctx;
    w->done = std::move(done);
    {
      std::lock_guard<std::mutex> lock(g_gate.mu);
      if (g_gate.queue.empty() && HasRoom()) {
        TakeTicket();
        w->state = Waiter::State::kDone;
      }
    }
    if (w->state == Waiter::State::kDone) {
      Grant(ctx, w->done);
      return;
    }
    // Registered before the call is queued: once queued it may be admitted, and done, at any
    // moment, after which neither ctx nor its cancellation manager may be touched here.
    w->cm = ctx->cancellation_manager();
    if (w->cm != nullptr) {
      w->token = w->cm->get_cancellation_token();
      if (!w->cm->RegisterCallback(w->token, [w] { CancelWaiter(w); })) {
        w->cm = nullptr;
        ctx->SetStatus(errors::Cancelled("MalleableGateAcquire: cancelled before it waited"));
        w->done();
        return;
      }
    }
    bool cancelled = false;
    std::vector<std::shared_ptr<Waiter>> admitted;
    {
      std::lock_guard<std::mutex> lock(g_gate.mu);
      if (w->state == Waiter::State::kCancelled) {
        cancelled = true;
      } else {
        w->state = Waiter::State::kQueued;
        g_gate.queue.push_back(w);
        admitted = AdmitLocked();     // room may have come since the first look
      }
    }
    if (cancelled) {
      if (w->cm != nullptr) w->cm->TryDeregisterCallback(w->token);
      ctx->SetStatus(errors::Cancelled("MalleableGateAcquire: cancelled before it waited"));
      w->done();
      return;
    }
    Finish(std::move(admitted));
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

namespace {

void Grant(tensorflow::OpKernelContext* ctx, const tensorflow::AsyncOpKernel::DoneCallback& done) {
  MalleableGateTicket ticket{std::make_shared<TicketSlot>()};
  tensorflow::Tensor* out = nullptr;
  tensorflow::Status status = ctx->allocate_output(0, tensorflow::TensorShape({}), &out);
  if (status.ok()) {
    out->scalar<tensorflow::Variant>()() = std::move(ticket);
  } else {
    ctx->SetStatus(status);   // the ticket's slot is returned as `ticket` goes
  }
  done();
}

}  // namespace
