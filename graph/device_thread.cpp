// See device_thread.h.
#include "graph/device_thread.h"

#include "graph/invocation.h"

namespace pipeline::graph {

DeviceThread::~DeviceThread() { join(true); }

void DeviceThread::start(Gateway& gateway) {
  gateway_ = &gateway;
  gateway_->reserve_wait();
  thread_ = std::thread([this] { main(); });
}

void DeviceThread::hand_over(Packet& p) { queue_.enqueue(std::move(p)); }

void DeviceThread::cancel() {
  Packet wake;  // no edge: tells the thread to leave
  queue_.enqueue(std::move(wake));
}

void DeviceThread::join(bool cancel_first) {
  if (!thread_.joinable()) return;
  if (cancel_first) cancel();
  thread_.join();
}

void DeviceThread::main() {
  try {
    st_.stage->initialize();
  } catch (const std::exception& e) {
    rt_.fail(st_.spec.name, std::make_exception_ptr(std::runtime_error(std::string("initialize: ") + e.what())));
  } catch (...) {
    rt_.fail(st_.spec.name, std::current_exception());
  }
  // After a failure the loop goes on, dropping inputs, until the end of stream has passed
  // through: the producers never wait on a thread that left.
  while (!st_.done.load(std::memory_order_acquire)) {
    Packet p;
    queue_.wait_dequeue(p);
    if (!p.edge) break;
    try {
      rt_.fault_point(EngineSite::device_thread, st_);
      st_.worker_slots.release();  // the next input may be queued while this one runs
      run_packet(rt_, st_, p, Delivery::gateway, gateway_);
    } catch (...) {
      // An error of the engine's own code (stage code has its own guard): the graph is
      // cancelled, and a wake-up is on its way to this thread.
      rt_.fault(EngineSite::device_thread, st_, std::current_exception());
    }
  }
  gateway_->release_wait();
}

}  // namespace pipeline::graph
