// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/state.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <streambuf>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kf/peer.hpp"

namespace kf {

namespace {

constexpr char kMagic[] = "KFSTATE1\n";

// Fields of a buffer's entry in a file's header, read without trusting their types: nullopt
// when the field is missing or of another type (nlohmann's value() would throw its own error).
std::optional<std::string> string_field(const nlohmann::json& entry, const char* key) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::optional<std::size_t> count_field(const nlohmann::json& entry, const char* key) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<std::size_t>();
}

}  // namespace

void State::add(const std::string& name, Buffer buf) {
  if (buffers_.count(name)) {
    throw std::invalid_argument("State::add: '" + name + "' is registered twice");
  }
  buffers_.emplace(name, Entry{buf, {}});
}

std::int64_t& State::counter(const std::string& name) { return counters_[name]; }

void State::commit() {
  for (auto& [name, e] : buffers_) {
    if (e.live.device == Device::cpu) {
      const auto* p = static_cast<const std::byte*>(e.live.data);
      e.saved.assign(p, p + e.live.bytes());
    } else {
      e.saved.resize(e.live.bytes());
      copy_buffer(Buffer{e.saved.data(), e.saved.size(), DType::u8, Device::cpu},
                  Buffer{e.live.data, e.saved.size(), DType::u8, e.live.device});
    }
  }
  saved_counters_ = counters_;
  has_commit_ = true;
  ++commits_;
}

void State::restore() {
  if (!has_commit_) throw std::logic_error("State::restore: nothing was committed yet");
  for (auto& [name, e] : buffers_) put(e, e.saved);
  assign_counters(saved_counters_);
}

// A buffer's live memory (host or device) = `bytes`.
void State::put(Entry& e, const std::vector<std::byte>& bytes) {
  if (bytes.empty()) return;
  if (e.live.device == Device::cpu) {
    std::memcpy(e.live.data, bytes.data(), bytes.size());
  } else {
    copy_buffer(Buffer{e.live.data, bytes.size(), DType::u8, e.live.device},
                Buffer{const_cast<std::byte*>(bytes.data()), bytes.size(), DType::u8, Device::cpu});
  }
}

// Values are assigned key by key, never by replacing the map: callers hold references to
// counters (State::counter) across restore(), sync() and load().
void State::assign_counters(const std::map<std::string, std::int64_t>& values) {
  for (auto& [name, v] : counters_) {
    auto it = values.find(name);
    v = it == values.end() ? 0 : it->second;
  }
  for (const auto& [name, v] : values) counters_.try_emplace(name, v);
}

std::size_t State::bytes() const noexcept {
  std::size_t n = counters_.size() * sizeof(std::int64_t);
  for (const auto& [name, e] : buffers_) n += e.live.bytes();
  return n;
}

std::string State::layout() const {
  std::string s;
  for (const auto& [name, e] : buffers_) {
    s += name + ":" + std::string(to_string(e.live.dtype)) + ":" + std::to_string(e.live.count) +
         ";";
  }
  s += "|";
  for (const auto& [name, v] : counters_) s += name + ";";
  return s;
}

void State::sync(Peer& peer, int root) {
  const std::string lay = layout();
  bool same = false;
  std::vector<std::uint8_t> bytes(lay.begin(), lay.end());
  peer.consensus("kf.state/layout", buffer(bytes.data(), bytes.size()), &same).wait();
  if (!same) {
    throw std::runtime_error(
        "State::sync: workers registered different state (this worker: " + lay + ")");
  }
  CollOptions o;
  o.root = root;
  std::vector<Handle> pending;
  for (auto& [name, e] : buffers_) pending.push_back(peer.broadcast("kf.state/" + name, e.live, o));
  std::vector<std::int64_t> values;
  for (const auto& [name, v] : counters_) values.push_back(v);
  pending.push_back(peer.broadcast("kf.state/counters", buffer(values.data(), values.size()), o));
  for (auto& h : pending) h.wait();
  std::size_t i = 0;
  for (auto& [name, v] : counters_) v = values[i++];
  commit();
}

std::string State::commit_header() const {
  if (!has_commit_) throw std::logic_error("State: nothing was committed yet");
  nlohmann::json header;
  header["counters"] = saved_counters_;
  header["buffers"] = nlohmann::json::array();
  for (const auto& [name, e] : buffers_) {
    header["buffers"].push_back(
        {{"name", name}, {"dtype", to_string(e.live.dtype)}, {"count", e.live.count}});
  }
  return kMagic + header.dump() + "\n";
}

void State::save(const std::string& path) const {
  if (!has_commit_) throw std::logic_error("State::save: nothing was committed yet");
  const std::string head = commit_header();
  std::vector<std::string_view> pieces{head};
  for (const auto& [name, e] : buffers_) {
    pieces.emplace_back(reinterpret_cast<const char*>(e.saved.data()), e.saved.size());
  }
  try {
    write_file_atomically(path, pieces, 0644, [](const std::string& why) {
      KF_LOG(warn, "state", "checkpoint: {}", why);
    });
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("cannot save the state file: ") + e.what());
  }
}

std::string State::snapshot() const {
  std::string out = commit_header();
  std::size_t size = out.size();
  for (const auto& [name, e] : buffers_) size += e.saved.size();
  out.reserve(size);
  for (const auto& [name, e] : buffers_) {
    out.append(reinterpret_cast<const char*>(e.saved.data()), e.saved.size());
  }
  return out;
}

namespace {

// Reads bytes held in memory as a stream, without copying them.
class MemoryStreamBuf : public std::streambuf {
 public:
  explicit MemoryStreamBuf(std::string_view bytes) {
    char* begin = const_cast<char*>(bytes.data());  // only read: the get area
    setg(begin, begin, begin + bytes.size());
  }
};

}  // namespace

void State::restore_snapshot(std::string_view bytes) {
  MemoryStreamBuf buf(bytes);
  std::istream in(&buf);
  read_commit(in, "snapshot");
}

void State::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read state file '" + path + "'");
  read_commit(in, "state file '" + path + "'");
}

void State::read_commit(std::istream& in, const std::string& what) {
  auto fail = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error(what + ": " + why);
  };
  std::string magic(sizeof kMagic - 1, '\0');
  in.read(magic.data(), static_cast<std::streamsize>(magic.size()));
  if (!in || magic != kMagic) throw fail("not a kf state file");
  std::string line;
  if (!std::getline(in, line)) throw fail("truncated header");
  nlohmann::json header;
  try {
    header = parse_json(line);
  } catch (const std::exception& e) {
    throw fail(std::string("malformed header: ") + e.what());
  }
  if (!header.contains("buffers") || !header["buffers"].is_array() ||
      !header.contains("counters") || !header["counters"].is_object()) {
    throw fail("header lacks buffers or counters");
  }
  const auto& bs = header["buffers"];
  if (bs.size() != buffers_.size()) {
    throw fail("holds " + std::to_string(bs.size()) + " buffers, this worker registered " +
               std::to_string(buffers_.size()));
  }
  std::size_t i = 0;
  for (const auto& [name, e] : buffers_) {
    const auto& b = bs[i++];
    if (!b.is_object() || string_field(b, "name") != name) {
      throw fail("has no buffer '" + name + "'");
    }
    const auto dtype = string_field(b, "dtype");
    const auto count = count_field(b, "count");
    if (dtype != to_string(e.live.dtype) || count != e.live.count) {
      throw fail("buffer '" + name + "' is " + dtype.value_or("?") + " x " +
                 (count ? std::to_string(*count) : std::string("?")) + ", this worker has " +
                 std::string(to_string(e.live.dtype)) + " x " + std::to_string(e.live.count));
    }
  }
  std::vector<std::vector<std::byte>> data;
  for (const auto& [name, e] : buffers_) {
    std::vector<std::byte> d(e.live.bytes());
    in.read(reinterpret_cast<char*>(d.data()), static_cast<std::streamsize>(d.size()));
    if (!in) throw fail("truncated in buffer '" + name + "'");
    data.push_back(std::move(d));
  }
  if (in.peek() != std::char_traits<char>::eof()) throw fail("has trailing bytes");
  std::map<std::string, std::int64_t> counters;
  for (const auto& [k, v] : header["counters"].items()) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() &&
         v.get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()})) {
      throw fail("counter '" + k + "' is not a 64-bit signed integer");
    }
    counters[k] = v.get<std::int64_t>();
  }
  i = 0;
  for (auto& [name, e] : buffers_) put(e, data[i++]);
  assign_counters(counters);
  commit();
}

}  // namespace kf
