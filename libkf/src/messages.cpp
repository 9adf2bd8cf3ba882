// SPDX-License-Identifier: Apache-2.0
// Point-to-point messages (Peer::send, Peer::try_receive): one worker's named payload to one
// other, outside any collective. A message goes as data frames of its name, one per
// max_frame_bytes of payload, tagged 0, 1, ... in order; the receiver's mailbox keeps them as
// early frames (within its limits) until the receiver takes the whole message. Nothing here
// waits for the receiver: the sender's handle completes once the frames are written, and a
// receive that finds the message incomplete returns at once.
#include <algorithm>
#include <cstring>

#include "kf/common/error.hpp"
#include "peer_impl.hpp"

namespace kf::detail {
namespace {

// The frames of a message of `bytes` payload bytes, and the payload bytes of frame i.
std::size_t frames_of(std::size_t bytes, std::size_t frame) noexcept {
  return bytes == 0 ? 1 : (bytes + frame - 1) / frame;
}
std::size_t frame_bytes(std::size_t bytes, std::size_t frame, std::size_t i) noexcept {
  return std::min(frame, bytes - i * frame);
}

// Waits until every frame's request of a message is done; the first error among them, if any.
template <class Request>
awaitable<std::error_code> all_done(const std::vector<std::shared_ptr<Request>>& reqs) {
  std::error_code ec;
  for (const auto& r : reqs) {
    if (!r->ev.done) co_await r->ev.timer().async_wait(asio::as_tuple(asio::use_awaitable));
    if (r->ev.ec && !ec) ec = r->ev.ec;
  }
  co_return ec;
}

}  // namespace

std::string PeerImpl::check_message(const char* what, int rank, std::string_view name,
                                    const Buffer& buf, const char* role) const {
  if (cluster_.workers.empty()) return "the peer has no cluster yet (call start())";
  if (rank < 0 || rank >= static_cast<int>(cluster_.size())) {
    return std::string(role) + " " + std::to_string(rank) + " is not a rank of this " +
           std::to_string(cluster_.size()) + "-worker cluster";
  }
  if (rank == rank_) return std::string("a worker cannot ") + what + " itself";
  if (name.empty() || name.size() > transport::kMaxNameBytes) {
    return "a message needs a name of 1-" + std::to_string(transport::kMaxNameBytes) + " bytes";
  }
  if (buf.device != Device::cpu) return "messages take host buffers only";
  if (buf.count > 0 && buf.data == nullptr) return "the buffer is null";
  return {};
}

Handle PeerImpl::send(int to, std::string_view name, Buffer buf) {
  auto state = std::make_shared<OpState>();
  state->driver = driver_;
  Handle h(state);
  if (const std::string why = check_message("send to", to, name, buf, "to"); !why.empty()) {
    state->complete(make_error_code(errc::invalid_argument),
                    "send '" + std::string(name) + "': " + why);
    return h;
  }
  const int peer = (*rank_to_peer_)[static_cast<std::size_t>(to)];
  const std::uint64_t version = cluster_.version;
  const std::string target = cluster_.workers[static_cast<std::size_t>(to)].endpoint.str();
  asio::co_spawn(
      ioc_,
      [this, state, peer, version, target, name = std::string(name), buf]() -> awaitable<void> {
        const std::size_t bytes = buf.bytes();
        const std::size_t frame = std::max<std::size_t>(1, opts_.max_frame_bytes);
        const std::size_t n = frames_of(bytes, frame);
        const auto* data = static_cast<const std::byte*>(buf.data);
        std::vector<std::shared_ptr<SendReq>> reqs;
        reqs.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
          transport::FrameHeader hd;
          hd.type = transport::FrameType::data;
          hd.cluster_version = version;
          hd.tag = static_cast<std::uint32_t>(i);
          hd.name_bytes = static_cast<std::uint32_t>(name.size());
          hd.payload_bytes = bytes == 0 ? 0 : frame_bytes(bytes, frame, i);
          reqs.push_back(mesh_.post_send(peer, hd, name, bytes == 0 ? nullptr : data + i * frame));
        }
        const std::error_code ec = co_await all_done(reqs);
        state->complete(
            ec, ec ? "send '" + name + "' to " + target + " was not delivered: " + ec.message()
                   : std::string());
      },
      asio::detached);
  driver_->run_ready();
  return h;
}

bool PeerImpl::try_receive(int from, std::string_view name, Buffer buf) {
  if (const std::string why = check_message("receive from", from, name, buf, "from");
      !why.empty()) {
    throw Error(make_error_code(errc::invalid_argument),
                "try_receive '" + std::string(name) + "': " + why);
  }
  const int peer = (*rank_to_peer_)[static_cast<std::size_t>(from)];
  const std::uint64_t version = cluster_.version;
  std::string failure;
  const bool taken = on_io([&]() -> awaitable<bool> {
    const std::size_t bytes = buf.bytes();
    const std::size_t frame = std::max<std::size_t>(1, opts_.max_frame_bytes);
    const std::size_t n = frames_of(bytes, frame);
    for (std::size_t i = 0; i < n; ++i) {
      if (!mailbox_.has_early({peer, version, static_cast<std::uint32_t>(i), name})) {
        co_return false;  // not (all) here yet
      }
    }
    auto* dst = static_cast<std::byte*>(buf.data);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t want = bytes == 0 ? 0 : frame_bytes(bytes, frame, i);
      auto req = mailbox_.take_early_into({peer, version, static_cast<std::uint32_t>(i), name},
                                          bytes == 0 ? nullptr : dst + i * frame, want, nullptr);
      if (req && req->ev.ec && failure.empty()) {
        failure = "frame " + std::to_string(i) + " of the message is not the " +
                  std::to_string(want) + " bytes a message of " + std::to_string(bytes) +
                  " bytes has there";
      }
    }
    co_return true;
  });
  if (!failure.empty()) {
    throw Error(make_error_code(errc::protocol_error),
                "try_receive '" + std::string(name) + "' from rank " + std::to_string(from) + ": " +
                    failure + " (the sender sent another size; the message is dropped)");
  }
  return taken;
}

Handle PeerImpl::receive(int from, std::string_view name, Buffer buf) {
  auto state = std::make_shared<OpState>();
  state->driver = driver_;
  Handle h(state);
  if (const std::string why = check_message("receive from", from, name, buf, "from");
      !why.empty()) {
    state->complete(make_error_code(errc::invalid_argument),
                    "receive '" + std::string(name) + "': " + why);
    return h;
  }
  const int peer = (*rank_to_peer_)[static_cast<std::size_t>(from)];
  const std::uint64_t version = cluster_.version;
  const std::string source = cluster_.workers[static_cast<std::size_t>(from)].endpoint.str();
  asio::co_spawn(
      ioc_,
      [this, state, peer, version, source, name = std::string(name), buf]() -> awaitable<void> {
        const std::size_t bytes = buf.bytes();
        const std::size_t frame = std::max<std::size_t>(1, opts_.max_frame_bytes);
        const std::size_t n = frames_of(bytes, frame);
        auto* dst = static_cast<std::byte*>(buf.data);
        // Every frame's receive is posted before any is waited for: frames that came early are
        // taken now, the others land straight in `buf` as they come.
        std::vector<std::shared_ptr<RecvReq>> reqs;
        reqs.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
          reqs.push_back(mesh_.post_recv({peer, version, static_cast<std::uint32_t>(i), name},
                                         bytes == 0 ? nullptr : dst + i * frame,
                                         bytes == 0 ? 0 : frame_bytes(bytes, frame, i)));
        }
        const std::error_code ec = co_await all_done(reqs);
        state->complete(
            ec, ec ? "receive '" + name + "' from " + source + ": " + ec.message() : std::string());
      },
      asio::detached);
  driver_->run_ready();
  return h;
}

}  // namespace kf::detail
