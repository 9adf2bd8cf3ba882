// SPDX-License-Identifier: Apache-2.0
// kf::SharedMemory (kf/shared_memory.hpp) and the registry of regions (common/shared_regions.hpp).
#include "kf/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include "common/shared_regions.hpp"

namespace kf {
namespace detail {
namespace {

struct Region {
  std::size_t bytes;
  int fd;
  std::uint64_t id;
};

struct Registry {
  std::mutex mu;
  std::map<std::uintptr_t, Region> by_base;
  std::uint64_t next_id = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

std::optional<SharedRegionRef> find_shared_region(const void* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const std::uintptr_t off = a - it->first;
  if (off > it->second.bytes || n > it->second.bytes - off) return std::nullopt;
  return SharedRegionRef{it->second.fd, it->second.id, off};
}

void add_shared_region(const std::byte* base, std::size_t bytes, int fd) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_base[reinterpret_cast<std::uintptr_t>(base)] = Region{bytes, fd, r.next_id++};
}

void remove_shared_region(const std::byte* base) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.by_base.erase(reinterpret_cast<std::uintptr_t>(base));
}

}  // namespace detail

namespace {

[[noreturn]] void fail(const char* call, std::size_t bytes) {
  throw std::system_error(
      errno, std::system_category(),
      std::string("SharedMemory of ") + std::to_string(bytes) + " bytes: " + call);
}

}  // namespace

SharedMemory::SharedMemory(std::size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  // Sealed against shrinking: a peer that maps it then never touches a page past its end
  // (which would be SIGBUS), whatever this process does with the file later.
  fd_ = ::memfd_create("kf-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd_ < 0) fail("memfd_create", bytes);
  if (::ftruncate(fd_, static_cast<off_t>(mapped_)) != 0) {
    const int e = errno;
    ::close(fd_);
    errno = e;
    fail("ftruncate", bytes);
  }
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    const int e = errno;
    ::close(fd_);
    errno = e;
    fail("fcntl(F_ADD_SEALS)", bytes);
  }
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd_);
    errno = e;
    fail("mmap", bytes);
  }
  data_ = static_cast<std::byte*>(p);
  detail::add_shared_region(data_, mapped_, fd_);
}

SharedMemory::~SharedMemory() { release(); }

SharedMemory::SharedMemory(SharedMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void SharedMemory::release() noexcept {
  if (data_ == nullptr) return;
  // Out of the registry before the descriptor can be reused by another file.
  detail::remove_shared_region(data_);
  ::munmap(data_, mapped_);
  ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

}  // namespace kf
