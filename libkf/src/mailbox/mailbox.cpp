// SPDX-License-Identifier: Apache-2.0
// The mailbox's matching of frames and receives (mailbox/mailbox.hpp).
#include "mailbox/mailbox.hpp"

#include <cstring>

namespace kf::detail {

Mailbox::Mailbox(const Driver& driver, const asio::any_io_executor& ex,
                 std::size_t max_unexpected_bytes, std::size_t max_unexpected_bytes_per_peer)
    : driver_(driver),
      ex_(ex),
      max_unexpected_bytes_(max_unexpected_bytes),
      max_unexpected_bytes_per_peer_(max_unexpected_bytes_per_peer),
      received_(std::make_shared<RecvReq>(ex, MailKey{})) {
  received_->ev.set({});
}

std::error_code Mailbox::store(const MailKeyView& key, std::span<const std::byte> payload,
                               ScratchPool::Block* owned, std::uint64_t current_version,
                               bool& stale, std::string& why) {
  KF_DCHECK_IO(driver_);
  stale = false;
  if (claiming_) {
    std::error_code conn;
    if (claim_(claimer_, key, payload, conn, why)) return conn;
  }
  auto it = slots_.empty() ? slots_.end() : slots_.find(key);
  if (it != slots_.end() && !it->second.posted.empty()) {
    auto req = it->second.posted.front();
    it->second.posted.erase(it->second.posted.begin());
    if (it->second.empty()) drop_slot(it);
    if (req->bytes != payload.size()) {
      why = wrong_size(key.name, payload.size(), req->bytes);
      req->ev.set(make_error_code(errc::protocol_error));
      return make_error_code(errc::protocol_error);
    }
    deliver(*req, payload.data(), 0, payload.size());
    req->ev.set({});
    return {};
  }
  if (key.version < current_version) {
    stale = true;
    return {};
  }
  if (!has_room(key.peer, payload.size(), key.name.size(), why))
    return make_error_code(errc::protocol_error);
  keep_early(key, payload, owned, it);
  return {};
}

void Mailbox::keep_early(const MailKeyView& key, std::span<const std::byte> payload,
                         ScratchPool::Block* owned, Slots::iterator it) {
  const std::size_t charged = early_charge(payload.size(), key.name.size());
  unexpected_bytes_ += charged;
  const auto p = static_cast<std::size_t>(key.peer);
  if (p >= unexpected_by_peer_.size()) unexpected_by_peer_.resize(p + 1, 0);
  unexpected_by_peer_[p] += charged;
  early_bytes_.store(early_bytes_.load(std::memory_order_relaxed) + payload.size(),
                     std::memory_order_relaxed);
  // Counted once the frame is kept (below, before the function returns), so that a reader that
  // sees the count change finds the frame.
  struct CountWatched {
    Mailbox& m;
    bool watched;
    ~CountWatched() {
      if (watched) m.watched_arrivals_.fetch_add(1, std::memory_order_release);
    }
  } count_watched{*this, !watched_.empty() && key.name == watched_};
  if (key.tag == 0 && payload.size() <= EarlyFrame::kSmallBytes && slots_.empty() &&
      key.name.size() <= QuickEarly::kNameBytes && quick_early_.size() < QuickEarly::kMax) {
    QuickEarly& q = quick_early_.emplace_back();
    q.peer = key.peer;
    q.version = key.version;
    q.name_bytes = key.name.size();
    std::memcpy(q.name_chars.data(), key.name.data(), key.name.size());
    q.frame.bytes = payload.size();
    q.frame.charged = charged;
    if (!payload.empty()) std::memcpy(q.frame.small.data(), payload.data(), payload.size());
    return;
  }
  EarlyFrame early{owned ? std::move(*owned) : early_block(payload.size()), payload.size(),
                   charged};
  if (!owned && !payload.empty()) {
    std::memcpy(early.block.data.get(), payload.data(), payload.size());
  }
  (it != slots_.end() ? it : add_slot(key))->second.unexpected.push_back(std::move(early));
}

std::shared_ptr<RecvReq> Mailbox::begin_fill(const MailKeyView& key) {
  KF_DCHECK_IO(driver_);
  auto it = slots_.find(key);
  if (it == slots_.end() || it->second.posted.empty()) return nullptr;
  auto req = it->second.posted.front();
  req->in_progress = true;
  return req;
}

void Mailbox::end_fill(const MailKeyView& key, const std::shared_ptr<RecvReq>& req,
                       std::error_code ec) {
  KF_DCHECK_IO(driver_);
  req->in_progress = false;
  auto it = slots_.find(key);
  if (it != slots_.end() && !it->second.posted.empty() && it->second.posted.front() == req) {
    it->second.posted.erase(it->second.posted.begin());
    if (it->second.empty()) slots_.erase(it);
  }
  req->ev.set(ec);
}

bool Mailbox::has_room(int peer, std::size_t bytes, std::size_t name_bytes,
                       std::string& why) const {
  const std::size_t charge = early_charge(bytes, name_bytes);
  if (unexpected_bytes(peer) + charge > max_unexpected_bytes_per_peer_) {
    why = "peer sent more unrequested data than the limit of " +
          std::to_string(max_unexpected_bytes_per_peer_) + " bytes per peer (" +
          std::to_string(unexpected_bytes(peer)) + " held, " + std::to_string(charge) +
          " more with the frame's name and bookkeeping)";
    return false;
  }
  if (unexpected_bytes_ + charge > max_unexpected_bytes_) {
    why = "peers sent more unrequested data than the limit of " +
          std::to_string(max_unexpected_bytes_) + " bytes (" + std::to_string(unexpected_bytes_) +
          " held, " + std::to_string(charge) + " more with the frame's name and bookkeeping)";
    return false;
  }
  return true;
}

ScratchPool::Block Mailbox::early_block(std::size_t bytes) {
  return early_pool_for(bytes).acquire(std::max(bytes, kSmallEarlyBytes));
}

void Mailbox::recycle(ScratchPool::Block b) { early_pool_for(b.bytes).release(std::move(b)); }

std::shared_ptr<RecvReq> Mailbox::take_early_into(const MailKeyView& key, std::byte* dst,
                                                  std::size_t bytes,
                                                  const ReduceOnArrival* reduce) {
  auto taken = take_early(key);
  if (!taken) return nullptr;
  EarlyFrame& early = *taken;
  std::shared_ptr<RecvReq> req = received_;
  if (early.bytes != bytes) {
    req = std::make_shared<RecvReq>(ex_, key.owned());
    req->ev.set(make_error_code(errc::protocol_error));
  } else if (reduce) {
    deliver_to(dst, true, reduce->src, reduce->dtype, reduce->op, early.data(), bytes);
  } else {
    deliver_to(dst, false, nullptr, DType::u8, ReduceOp::sum, early.data(), bytes);
  }
  recycle(std::move(early.block));
  return req;
}

std::shared_ptr<RecvReq> Mailbox::post(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                       const ReduceOnArrival* reduce, std::error_code refusal) {
  KF_DCHECK_IO(driver_);
  auto req = std::make_shared<RecvReq>(ex_, key.owned());
  req->dst = dst;
  req->bytes = bytes;
  if (reduce) {
    req->reduce = true;
    req->src = reduce->src;
    req->dtype = reduce->dtype;
    req->op = reduce->op;
  }
  auto it = slot_for(key);
  if (refusal) {
    if (it->second.empty()) drop_slot(it);
    req->ev.set(refusal);
    return req;
  }
  it->second.posted.push_back(req);
  return req;
}

// No slot in use, the usual case: the slots are not even searched.
std::optional<EarlyFrame> Mailbox::take_early(const MailKeyView& key) {
  KF_DCHECK_IO(driver_);
  if (key.tag == 0) {
    for (auto q = quick_early_.begin(); q != quick_early_.end(); ++q) {
      if (q->peer == key.peer && q->version == key.version && q->name() == key.name) {
        std::optional<EarlyFrame> early(std::move(q->frame));
        uncharge(q->peer, early->charged);
        quick_early_.erase(q);
        return early;
      }
    }
  }
  if (slots_.empty()) return std::nullopt;
  auto it = slots_.find(key);
  if (it == slots_.end() || it->second.unexpected.empty()) return std::nullopt;
  EarlyFrame early = std::move(it->second.unexpected.front());
  it->second.unexpected.erase(it->second.unexpected.begin());
  uncharge(key.peer, early.charged);
  if (it->second.empty()) drop_slot(it);
  return early;
}

bool Mailbox::has_early(const MailKeyView& key) const {
  KF_DCHECK_IO(driver_);
  if (key.tag == 0) {
    for (const auto& q : quick_early_) {
      if (q.peer == key.peer && q.version == key.version && q.name() == key.name) return true;
    }
  }
  if (slots_.empty()) return false;
  const auto it = slots_.find(key);
  return it != slots_.end() && !it->second.unexpected.empty();
}

void Mailbox::cancel(const std::shared_ptr<RecvReq>& r, std::error_code ec) {
  KF_DCHECK_IO(driver_);
  if (r->ev.done || r->in_progress) return;
  auto it = slots_.find(r->key);
  if (it != slots_.end()) {
    auto& posted = it->second.posted;
    posted.erase(std::remove(posted.begin(), posted.end(), r), posted.end());
    if (it->second.empty()) slots_.erase(it);
  }
  r->ev.set(ec);
}

void Mailbox::fail_posted(const KeyMatch& match, std::error_code ec) {
  KF_DCHECK_IO(driver_);
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (match(it->first) && !it->second.posted.empty()) {
      for (auto& r : it->second.posted) {
        if (!r->in_progress) r->ev.set(ec);
      }
      it->second.drop_idle();
      if (it->second.empty()) {
        it = slots_.erase(it);
        continue;
      }
    }
    ++it;
  }
  if (claiming_) fail_claims_(claimer_, match, ec);
}

void Mailbox::drop_older(std::uint64_t version) {
  KF_DCHECK_IO(driver_);
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->first.version >= version) {
      ++it;
      continue;
    }
    for (const auto& d : it->second.unexpected) uncharge(it->first.peer, d.charged);
    it->second.unexpected.clear();
    it = it->second.posted.empty() ? slots_.erase(it) : std::next(it);
  }
  quick_early_.erase(std::remove_if(quick_early_.begin(), quick_early_.end(),
                                    [&](const QuickEarly& q) {
                                      if (q.version >= version) return false;
                                      uncharge(q.peer, q.frame.charged);
                                      return true;
                                    }),
                     quick_early_.end());
}

Mailbox::Slots::iterator Mailbox::slot_for(const MailKeyView& key) {
  auto it = slots_.find(key);
  return it != slots_.end() ? it : add_slot(key);
}

Mailbox::Slots::iterator Mailbox::add_slot(const MailKeyView& key) {
  if (spare_slots_.empty()) return slots_.try_emplace(key.owned()).first;
  Slots::node_type node = std::move(spare_slots_.back());
  spare_slots_.pop_back();
  MailKey& k = node.key();
  k.peer = key.peer;
  k.version = key.version;
  k.tag = key.tag;
  k.name.assign(key.name);
  return slots_.insert(std::move(node)).position;
}

void Mailbox::drop_slot(Slots::iterator it) {
  constexpr std::size_t kSpareSlots = 16;
  if (spare_slots_.size() < kSpareSlots) {
    spare_slots_.push_back(slots_.extract(it));
  } else {
    slots_.erase(it);
  }
}

}  // namespace kf::detail
