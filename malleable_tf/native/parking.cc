// Thread parking for TensorFlow's CPU thread pools.
//
// TensorFlow sizes its intra-op and inter-op pools once. To run with fewer threads we "park"
// some of them: a parker is a closure scheduled into the pool that blocks its worker thread on a
// condition variable until it is released, so only size - parked threads run compute. Python
// drives it through the extern "C" functions below (ctypes); attach.cc fills in the pools.

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "internal.h"

namespace mtf_internal {

ParkingLot g_lots[2];

}  // namespace mtf_internal

namespace {

using mtf_internal::g_lots;
using mtf_internal::kInter;
using mtf_internal::kIntra;
using mtf_internal::ParkingLot;

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

}  // namespace

extern "C" {

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

// Release every parked thread for good: called at exit, so that TensorFlow can join its pools.
void mtf_shutdown() {
  mtf_poll_stop();
  mtf_gate_set_capacity(0);  // nothing may wait at the gate while the process exits
  // TensorFlow deletes every entry of its table when the device goes: give it back as built.
  mtf_internal::RestoreSplitWidth();
  for (ParkingLot& lot : g_lots) {
    std::unique_lock<std::mutex> lock(lot.mu);
    lot.shutdown = true;
    lot.target = 0;
    lot.cv.notify_all();
    lot.cv.wait_for(lock, std::chrono::seconds(5), [&lot] { return lot.parked == 0; });
  }
}

}  // extern "C"
