// SPDX-License-Identifier: Apache-2.0
#include "session/spares.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kf/common/log.hpp"
#include "kf/peer.hpp"
#include "kf/runtime/state.hpp"

namespace kf::detail {

namespace {

// A piece: the magic, then push, commit, offset and total as 8-byte little-endian integers,
// then the bytes.
constexpr std::string_view kPieceMagic = "KFSPARE1";
constexpr std::size_t kPieceHeaderBytes = kPieceMagic.size() + 4 * 8;
constexpr std::size_t kMaxPiecePayload = std::size_t{1} << 20;  // kf::Peer::invite's limit
constexpr std::size_t kDataPerPiece = kMaxPiecePayload - kPieceHeaderBytes;

void put_piece_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_piece_u64(std::string_view in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)]);
  }
  return v;
}

// A push's copy may take at most this share of rank 0's time.
constexpr int kDutyDivisor = 10;

constexpr std::string_view kHello = "KFSPAREHELLO";

}  // namespace

bool is_spare_hello(std::string_view payload) noexcept { return payload == kHello; }

void SpareGreeter::greet(Peer& peer, const std::vector<WorkerSpec>& to) {
  std::erase_if(pending_, [](const Handle& h) { return h.ready(); });
  for (const auto& w : to) {
    const std::string name = w.endpoint.str();
    if (w.endpoint == peer.endpoint() ||
        std::find(greeted_.begin(), greeted_.end(), name) != greeted_.end()) {
      continue;
    }
    greeted_.push_back(name);
    pending_.push_back(peer.invite(w.endpoint, std::string(kHello)));
  }
}

bool is_spare_piece(std::string_view payload) noexcept {
  return payload.substr(0, kPieceMagic.size()) == kPieceMagic;
}

std::vector<std::string> spare_pieces(std::uint64_t push, std::int64_t commit,
                                      std::string_view snapshot) {
  std::vector<std::string> pieces;
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kDataPerPiece, snapshot.size() - offset);
    std::string p;
    p.reserve(kPieceHeaderBytes + n);
    p.append(kPieceMagic);
    put_piece_u64(p, push);
    put_piece_u64(p, static_cast<std::uint64_t>(commit));
    put_piece_u64(p, offset);
    put_piece_u64(p, snapshot.size());
    p.append(snapshot.substr(offset, n));
    pieces.push_back(std::move(p));
    offset += n;
  } while (offset < snapshot.size());
  return pieces;
}

SparePiece decode_spare_piece(std::string_view payload) {
  if (!is_spare_piece(payload) || payload.size() < kPieceHeaderBytes) {
    throw std::invalid_argument("snapshot piece: shorter than its header");
  }
  SparePiece p;
  p.push = get_piece_u64(payload, kPieceMagic.size());
  p.commit = static_cast<std::int64_t>(get_piece_u64(payload, kPieceMagic.size() + 8));
  p.offset = get_piece_u64(payload, kPieceMagic.size() + 16);
  p.total = get_piece_u64(payload, kPieceMagic.size() + 24);
  p.data = payload.substr(kPieceHeaderBytes);
  if (p.commit < 0) throw std::invalid_argument("snapshot piece: negative commit");
  if (p.offset > p.total || p.data.size() > p.total - p.offset) {
    throw std::invalid_argument("snapshot piece: bytes " + std::to_string(p.offset) + "+" +
                                std::to_string(p.data.size()) + " lie outside its " +
                                std::to_string(p.total) + "-byte snapshot");
  }
  return p;
}

bool SnapshotAssembler::add(const Endpoint& from, std::string_view payload) {
  const SparePiece p = decode_spare_piece(payload);
  const bool continues =
      active_ && from == from_ && p.push == push_ && p.total == total_ && p.offset == bytes_.size();
  if (!continues) {
    active_ = false;
    if (p.offset != 0) return false;  // the middle of a push whose start we missed
    from_ = from;
    push_ = p.push;
    total_ = p.total;
    commit_ = p.commit;
    bytes_.clear();
    // Grown as pieces come, never reserved from the sender's word alone.
    active_ = true;
  }
  bytes_.append(p.data);
  if (bytes_.size() < total_) return false;
  active_ = false;
  return true;
}

void SparePusher::push(Peer& peer, const State& state, const Cluster& formed, std::int64_t commit) {
  if (!in_flight_.empty()) {
    const bool all_ready = std::all_of(in_flight_.begin(), in_flight_.end(),
                                       [](const Handle& h) { return h.ready(); });
    if (!all_ready) return;  // one push at a time: the wire's share is bounded by that
    bool failed = false;
    for (auto& h : in_flight_) {
      if (h.wait_status() && !failed_said_) {
        KF_LOG(warn, "session", "{}: a commit for a spare was not delivered: {}",
               peer.endpoint().str(), h.message());
        failed_said_ = true;
      }
      failed = failed || static_cast<bool>(h.wait_status());
    }
    if (!failed) ++done_;
    in_flight_.clear();
  }
  if (formed.spares.empty() || !state.has_commit()) return;
  // The copy runs on the training thread: it may take at most a tenth of the time since the
  // last push began.
  const auto now = std::chrono::steady_clock::now();
  if (pushes_ > 0 && (copy_time_ * kDutyDivisor > now - began_ || now - began_ < interval_)) {
    return;
  }
  began_ = now;
  ++pushes_;
  const std::vector<std::string> pieces = spare_pieces(pushes_, commit, state.snapshot());
  for (const auto& spare : formed.spares) {
    for (const auto& piece : pieces) in_flight_.push_back(peer.invite(spare.endpoint, piece));
  }
  copy_time_ = std::chrono::steady_clock::now() - began_;
}

}  // namespace kf::detail
