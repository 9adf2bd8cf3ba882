// SPDX-License-Identifier: Apache-2.0
// kf::State: the named pieces of a worker's training state (model, optimizer, counters such as
// step, epoch and sampler position) with the operations elastic training needs:
//   commit()   snapshot the live values (after a step all workers agreed on)
//   restore()  put the last snapshot back (after a failed step or a broken cluster)
//   sync()     give every worker one worker's values (joiners, before their first step)
//   save()/load()  the last snapshot to and from disk (when every worker was lost)
// Buffers are caller-owned memory registered by name; counters are owned by the state.
// Thread-safety: not thread-safe; use from the training thread.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kf/coll/types.hpp"

namespace kf {

class Peer;

class State {
 public:
  /// Registers `buf` (host or CUDA memory, owned by the caller, alive as long as the state)
  /// under `name`. Every worker must register the same names with the same shapes. A device
  /// buffer's snapshot is kept in host memory (commit copies it out, after the work enqueued on
  /// the legacy default stream; restore copies it back); sync broadcasts it on the device.
  /// Throws: std::invalid_argument for a duplicate name.
  void add(const std::string& name, Buffer buf);
  /// A 64-bit counter owned by the state, created at 0 on first use. The reference stays valid
  /// (and sees restored and synced values) as long as the state lives.
  std::int64_t& counter(const std::string& name);

  void commit();
  /// Throws: std::logic_error when nothing was committed yet.
  void restore();
  bool has_commit() const noexcept { return has_commit_; }
  std::uint64_t commits() const noexcept { return commits_; }

  /// Collective: every worker's buffers and counters become `root`'s, and the result is
  /// committed. Throws: kf::Error (e.g. errc::peer_lost); std::runtime_error when the workers'
  /// layouts (names, types, sizes) differ.
  void sync(Peer& peer, int root);

  /// Writes the last commit to `path` atomically (kf/runtime/atomic_file.hpp: a fresh temporary,
  /// fsync, rename, directory fsync).
  /// Throws: std::logic_error without a commit; std::runtime_error naming the file on I/O errors.
  void save(const std::string& path) const;
  /// Reads a file written by save() into the live buffers and counters and commits it.
  /// Throws: std::runtime_error naming the file and what does not match (a buffer missing, a
  /// different size or type, a truncated or foreign file).
  void load(const std::string& path);
  /// The last commit as the bytes save() would write (a hot spare's copy, docs/elastic.md).
  /// Throws: std::logic_error without a commit.
  std::string snapshot() const;
  /// Takes bytes from snapshot() (of a worker with the same layout) into the live buffers and
  /// counters and commits them. Throws: std::runtime_error saying what does not match, as
  /// load() does; the state is unchanged then.
  void restore_snapshot(std::string_view bytes);

  /// Bytes of the registered buffers and counters (what sync() sends).
  std::size_t bytes() const noexcept;

  /// "name:dtype:count;..." of the registered buffers, then the counters' names.
  std::string layout() const;

 private:
  std::string commit_header() const;
  void read_commit(std::istream& in, const std::string& what);
  void assign_counters(const std::map<std::string, std::int64_t>& values);

  struct Entry {
    Buffer live;
    std::vector<std::byte> saved;
  };
  static void put(Entry& e, const std::vector<std::byte>& bytes);
  std::map<std::string, Entry> buffers_;
  std::map<std::string, std::int64_t> counters_;
  std::map<std::string, std::int64_t> saved_counters_;
  bool has_commit_ = false;
  std::uint64_t commits_ = 0;
};

}  // namespace kf
