// MalleableAttach: the one op the runtime runs at init, to reach TensorFlow's CPU thread pools
// through an OpKernelContext. It hands the intra-op pool and the inter-op runner to the parking
// lots (parking.cc) and the device's Eigen device table to split_width.cc.

#include <functional>
#include <mutex>
#include <utility>

#include "internal.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

std::mutex g_attach_mu;
bool g_attached = false;

}  // namespace

extern "C" {

int mtf_attached() {
  std::lock_guard<std::mutex> l(g_attach_mu);
  return g_attached ? 1 : 0;
}

}  // extern "C"

namespace tensorflow {

using mtf_internal::g_lots;
using mtf_internal::kInter;
using mtf_internal::kIntra;

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
        mtf_internal::CaptureSplitWidth(ctx->device(), intra->NumThreads());
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

}  // namespace tensorflow
