// SPDX-License-Identifier: Apache-2.0
// Collectives on device buffers: the peer's device backends, made on the first such collective
// (docs/gpu.md). NCCL runs them when the build has it and both buffers are on the device;
// the staging backend runs the rest (consensus, a host buffer beside a device one) and all of
// them in builds without NCCL or with PeerOptions::device_backend = staging.
#include "backend/backend.hpp"
#include "backend/staging.hpp"
#include "config.hpp"
#include "device/device_api.hpp"
#include "kf/common/log.hpp"
#include "peer_impl.hpp"

#if KF_HAVE_NCCL
#include "backend/nccl.hpp"
#endif

namespace kf::detail {

struct PeerImpl::DeviceBackends {
  std::shared_ptr<DeviceApi> api;
  std::string why;  // when api is null: why device buffers cannot work here
  std::unique_ptr<StagingBackend> staging;
#if KF_HAVE_NCCL
  std::unique_ptr<NcclBackend> nccl;
  std::string nccl_why;  // when NCCL could not be set up
#endif
  std::string used;  // "nccl", "staging" or both, once used
};

namespace {

#if KF_HAVE_NCCL
// Whether NCCL can run this collective: every buffer it touches on this rank is on the device.
bool nccl_can_run(const CollCtx& c) {
  if (c.op == CollOp::consensus || c.op == CollOp::barrier) return false;
  const bool recv_unused = c.op == CollOp::gather && c.rank != c.opts.root;
  return c.send.device == Device::cuda && (recv_unused || c.recv.device == Device::cuda);
}
#endif

void note_use(std::string& used, const char* name) {
  if (used.find(name) != std::string::npos) return;
  used += used.empty() ? name : std::string("+") + name;
}

}  // namespace

PeerImpl::DeviceBackends& PeerImpl::device_backends() {
  std::lock_guard<std::mutex> lk(device_mu_);
  if (device_) return *device_;
  auto d = std::make_shared<DeviceBackends>();
  d->api = device_api(d->why);
  if (d->api) {
#if KF_HAVE_NCCL
    if (opts_.device_backend != DeviceBackend::staging && d->api->is_cuda()) {
      NcclBackend::PeerHooks hooks;
      hooks.host_submit = [this](std::shared_ptr<CollCtx> c) { return submit(std::move(c)); };
      hooks.lost_peers = [this] { return lost_peers(); };
      hooks.init_timeout = opts_.connect_timeout;
      try {
        d->nccl = std::make_unique<NcclBackend>(d->api, std::move(hooks));
      } catch (const std::exception& e) {
        d->nccl_why = e.what();
        KF_LOG(warn, "device",
               "{}: NCCL cannot be used ({}); device buffers go through host "
               "staging",
               mesh_.identity(), e.what());
      }
    }
#endif
    try {
      d->staging = std::make_unique<StagingBackend>(
          d->api, opts_.staging_chunk_bytes,
          [this](std::shared_ptr<CollCtx> c) { return submit(std::move(c)); });
    } catch (const std::exception& e) {
      d->why = e.what();
      d->api = nullptr;
    }
  }
  if (d->api) KF_LOG(debug, "device", "{}: device buffers on {}", mesh_.identity(), d->api->name());
  device_ = std::move(d);
  return *device_;
}

Handle PeerImpl::submit_device(std::shared_ptr<CollCtx> ctx) {
  // The backend completes it from its own threads: a waiter has no I/O to run.
  ctx->state->driver = nullptr;
  Handle h(ctx->state);
  const std::string label = std::string(to_string(ctx->op)) + " '" + ctx->name + "'";
  DeviceBackends& d = device_backends();
  if (!d.api) {
    ctx->state->complete(make_error_code(errc::device_error),
                         label + ": device buffers cannot be used here: " + d.why);
    return h;
  }
#if KF_HAVE_NCCL
  if (d.nccl && nccl_can_run(*ctx)) {
    {
      std::lock_guard<std::mutex> lk(device_mu_);
      note_use(d.used, "nccl");
    }
    d.nccl->run(std::move(ctx), cluster_);
    return h;
  }
#endif
  // What NCCL cannot do (consensus, a host buffer beside a device one) goes through staging
  // even with `nccl` forced; forcing it fails only where NCCL itself is missing.
#if KF_HAVE_NCCL
  const bool nccl_missing = !d.nccl;
#else
  const bool nccl_missing = true;
#endif
  if (opts_.device_backend == DeviceBackend::nccl && nccl_missing) {
#if KF_HAVE_NCCL
    const std::string why = "NCCL cannot be used: " + d.nccl_why;
#else
    const std::string why = "PeerOptions::device_backend is nccl, but this build has no NCCL";
#endif
    ctx->state->complete(make_error_code(errc::device_error), label + ": " + why);
    return h;
  }
  {
    std::lock_guard<std::mutex> lk(device_mu_);
    note_use(d.used, "staging");
  }
  d.staging->run(std::move(ctx));
  return h;
}

std::string PeerImpl::device_backend() {
  std::lock_guard<std::mutex> lk(device_mu_);
  if (!device_) return "none";
  if (!device_->api) return "unavailable: " + device_->why;
  return device_->used.empty() ? "none" : device_->used;
}

void PeerImpl::close_device() {
  std::shared_ptr<DeviceBackends> d;
  {
    std::lock_guard<std::mutex> lk(device_mu_);
    d = std::move(device_);
  }
  d.reset();
}

}  // namespace kf::detail
