// SPDX-License-Identifier: Apache-2.0
// A receiver's mappings of a sender's shared regions (transport/shared_map.hpp).
#include "transport/shared_map.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "kf/common/error.hpp"

namespace kf::transport {

namespace {

std::error_code last_error() { return {errno, std::system_category()}; }

}  // namespace

SharedMappings::~SharedMappings() {
  for (const Region& r : regions_) ::munmap(const_cast<std::byte*>(r.base), r.bytes);
  if (pidfd_ >= 0) ::close(pidfd_);
}

std::error_code SharedMappings::view(int fd, std::uint64_t id, std::uint64_t offset, std::size_t n,
                                     const std::byte*& out, std::string& why) {
  const Region* found = nullptr;
  for (const Region& r : regions_) {
    if (r.id == id) found = &r;
  }
  if (found == nullptr) {
    Region r{id, nullptr, 0};
    if (auto ec = map(fd, r, why)) return ec;
    if (regions_.size() == kMaxRegions) {
      ::munmap(const_cast<std::byte*>(regions_.front().base), regions_.front().bytes);
      regions_.erase(regions_.begin());
    }
    regions_.push_back(r);
    found = &regions_.back();
  }
  if (offset > found->bytes || n > found->bytes - offset) {
    why = "single-copy frame names bytes " + std::to_string(offset) + "+" + std::to_string(n) +
          " of a shared region of " + std::to_string(found->bytes);
    return make_error_code(errc::protocol_error);
  }
  out = found->base + offset;
  return {};
}

std::error_code SharedMappings::map(int fd, Region& r, std::string& why) {
  if (pidfd_ < 0) {
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    if (pidfd_ < 0) return last_error();
  }
  const int local = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd_, fd, 0));
  if (local < 0) {
    if (errno == EBADF) {
      why = "single-copy frame names descriptor " + std::to_string(fd) +
            ", which its sender does not have";
      return make_error_code(errc::protocol_error);
    }
    return last_error();
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{local};
  // Only a memory file that can no longer shrink: a page past its end would be SIGBUS here.
  const int seals = ::fcntl(local, F_GET_SEALS);
  struct stat st {};
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0 || ::fstat(local, &st) != 0 || st.st_size <= 0) {
    why = "single-copy frame names descriptor " + std::to_string(fd) +
          ", which is not a memory file sealed against shrinking";
    return make_error_code(errc::protocol_error);
  }
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, local, 0);
  if (p == MAP_FAILED) return last_error();
  r.base = static_cast<const std::byte*>(p);
  r.bytes = static_cast<std::size_t>(st.st_size);
  return {};
}

}  // namespace kf::transport
