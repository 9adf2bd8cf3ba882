// SPDX-License-Identifier: Apache-2.0
// DeviceApi over the CUDA runtime (device_api.hpp). Built into every libkf; without CUDA in the
// build, cuda_device_api says so. The device is the one current on the thread that first asks
// (cudaGetDevice); kf's own threads bind to it.
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "config.hpp"
#include "device/device_api.hpp"
#include "kf/common/error.hpp"

#if KF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kf::detail {

#if KF_HAVE_CUDA

namespace {

[[noreturn]] void fail(const char* what, cudaError_t e) {
  throw Error(make_error_code(errc::device_error),
              std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
void check(const char* what, cudaError_t e) {
  if (e != cudaSuccess) fail(what, e);
}

cudaStream_t as_stream(void* s) noexcept { return static_cast<cudaStream_t>(s); }

// A host function that a stream runs must not call CUDA, and kf's completions do (they destroy
// events, return page-locked blocks, start the next copies): the host function only hands each
// completion to this thread, which runs them in order. Made once per device and never destroyed,
// so that no exit-time destructor waits for a stream.
class Completions {
 public:
  explicit Completions(int device) {
    std::thread([this, device] {
      (void)cudaSetDevice(device);
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        cv_.wait(lk, [&] { return !queue_.empty(); });
        std::function<void()> f = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        f();
        f = nullptr;  // what it holds is released here, not under the lock
        lk.lock();
      }
    }).detach();
  }
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

class CudaApi final : public DeviceApi {
 public:
  explicit CudaApi(int device) : device_(device), completions_(new Completions(device)) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) name_ = prop.name;
  }
  std::string name() const override {
    return "CUDA device " + std::to_string(device_) + (name_.empty() ? "" : " (" + name_ + ")");
  }
  bool is_cuda() const noexcept override { return true; }
  void* alloc_host(std::size_t bytes) override {
    void* p = nullptr;
    check("cudaHostAlloc", cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
    return p;
  }
  void free_host(void* p) noexcept override { (void)cudaFreeHost(p); }
  void* alloc_device(std::size_t bytes) override {
    void* p = nullptr;
    check("cudaMalloc", cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    return p;
  }
  void free_device(void* p) noexcept override { (void)cudaFree(p); }
  void* create_stream() override {
    cudaStream_t s = nullptr;
    check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  void destroy_stream(void* stream) noexcept override {
    (void)cudaStreamDestroy(as_stream(stream));
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    check("cudaMemcpyAsync",
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
  }
  void call_after(void* stream, std::function<void()> f) override {
    struct Call {
      Completions* to;
      std::function<void()> f;
    };
    auto* heap = new Call{completions_, std::move(f)};
    const cudaError_t e = cudaLaunchHostFunc(
        as_stream(stream),
        [](void* arg) {
          std::unique_ptr<Call> call(static_cast<Call*>(arg));
          call->to->post(std::move(call->f));
        },
        heap);
    if (e != cudaSuccess) {
      delete heap;
      fail("cudaLaunchHostFunc", e);
    }
  }
  DeviceEvent record(void* stream) override {
    cudaEvent_t ev = nullptr;
    check("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    DeviceEvent held(ev, [](void* p) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    check("cudaEventRecord", cudaEventRecord(ev, as_stream(stream)));
    return held;
  }
  void wait(void* stream, const DeviceEvent& e) override {
    check("cudaStreamWaitEvent",
          cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(e.get()), 0));
  }
  bool done(const DeviceEvent& e) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e.get()));
    if (r == cudaErrorNotReady) return false;
    check("cudaEventQuery", r);
    return true;
  }
  void synchronize(void* stream) override {
    check("cudaStreamSynchronize", cudaStreamSynchronize(as_stream(stream)));
  }
  void bind_thread() override { check("cudaSetDevice", cudaSetDevice(device_)); }

 private:
  int device_;
  std::string name_;
  Completions* completions_;  // never freed: see Completions
};

}  // namespace

std::shared_ptr<DeviceApi> cuda_device_api(std::string& why) {
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e)
                           : std::string("no CUDA device");
    return nullptr;
  }
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    why = std::string("cudaGetDevice: ") + cudaGetErrorString(e);
    return nullptr;
  }
  // One per device, made once: kf::copy_buffer asks for every device buffer of every commit, and
  // making one reads the device's properties.
  static std::mutex mu;
  static std::map<int, std::shared_ptr<DeviceApi>> made;
  std::lock_guard<std::mutex> lk(mu);
  auto& api = made[device];
  if (!api) api = std::make_shared<CudaApi>(device);
  return api;
}

#else

std::shared_ptr<DeviceApi> cuda_device_api(std::string& why) {
  why = "this build of kf has no CUDA (configure with -Dcuda=enabled where CUDA is installed)";
  return nullptr;
}

#endif

}  // namespace kf::detail
