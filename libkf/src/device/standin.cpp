// SPDX-License-Identifier: Apache-2.0
// Host memory standing in for a CUDA device (device_api.hpp): every stream is a thread that
// runs its work in order, so that copies, marks and callbacks behave as on a device (in order
// per stream, concurrent across streams, the host not blocked). The null stream is a default
// stream of the stand-in's own.
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <pthread.h>
#include <thread>

#include "device/device_api.hpp"
#include "kf/common/error.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

namespace {

class StandinStream {
 public:
  StandinStream() : thread_([this] { loop(); }) {}
  ~StandinStream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StandinStream(const StandinStream&) = delete;
  StandinStream& operator=(const StandinStream&) = delete;

  void push(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      work_.push_back(std::move(f));
    }
    cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !work_.empty(); });
      if (work_.empty()) return;  // stopping, and all that was enqueued has run
      auto f = std::move(work_.front());
      work_.pop_front();
      lk.unlock();
      f();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool stop_ = false;
  std::thread thread_;
};

// A mark: set by its stream when it gets there.
struct Mark {
  std::mutex mu;
  std::condition_variable cv;
  bool set = false;
  void signal() {
    std::lock_guard<std::mutex> lk(mu);
    set = true;
    cv.notify_all();
  }
  void await() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return set; });
  }
};

class StandinApi final : public DeviceApi {
 public:
  std::string name() const override { return "host stand-in"; }
  bool is_cuda() const noexcept override { return false; }
  void* alloc_host(std::size_t bytes) override { return allocate(bytes); }
  void free_host(void* p) noexcept override { std::free(p); }
  void* alloc_device(std::size_t bytes) override { return allocate(bytes); }
  void free_device(void* p) noexcept override { std::free(p); }
  void* create_stream() override { return new StandinStream(); }
  void destroy_stream(void* stream) noexcept override {
    delete static_cast<StandinStream*>(stream);
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    on(stream).push([dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  void call_after(void* stream, std::function<void()> f) override { on(stream).push(std::move(f)); }
  DeviceEvent record(void* stream) override {
    auto m = std::make_shared<Mark>();
    on(stream).push([m] { m->signal(); });
    return m;
  }
  void wait(void* stream, const DeviceEvent& e) override {
    auto m = std::static_pointer_cast<Mark>(e);
    on(stream).push([m] { m->await(); });
  }
  bool done(const DeviceEvent& e) override {
    auto* m = static_cast<Mark*>(e.get());
    std::lock_guard<std::mutex> lk(m->mu);
    return m->set;
  }
  void synchronize(void* stream) override {
    auto e = record(stream);
    static_cast<Mark*>(e.get())->await();
  }
  void bind_thread() override {}

 private:
  StandinStream& on(void* stream) {
    return stream ? *static_cast<StandinStream*>(stream) : default_stream_;
  }
  static void* allocate(std::size_t bytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (!p) {
      throw Error(make_error_code(errc::device_error),
                  "host stand-in: out of memory for " + std::to_string(bytes) + " bytes");
    }
    return p;
  }
  StandinStream default_stream_;
};

std::mutex override_mu;
std::shared_ptr<DeviceApi>& override_api() {
  static std::shared_ptr<DeviceApi> api;
  return api;
}

}  // namespace

void start_device_thread(DeviceApi& api, const char* name) noexcept {
  pthread_setname_np(pthread_self(), name);
  try {
    api.bind_thread();
  } catch (const std::exception& e) {
    KF_LOG(warn, "device", "{}: {}", name, e.what());
  }
}

std::shared_ptr<DeviceApi> standin_device_api() { return std::make_shared<StandinApi>(); }

std::shared_ptr<DeviceApi> device_api(std::string& why) {
  {
    std::lock_guard<std::mutex> lk(override_mu);
    if (override_api()) return override_api();
  }
  return cuda_device_api(why);
}

void set_device_api_for_tests(std::shared_ptr<DeviceApi> api) {
  std::lock_guard<std::mutex> lk(override_mu);
  override_api() = std::move(api);
}

}  // namespace kf::detail
