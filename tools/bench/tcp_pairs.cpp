// SPDX-License-Identifier: Apache-2.0
// kf-bench-tcp-pairs: what the layout of loopback TCP connections costs a small exchange.
//
// Two processes swap a small message, both sending at once and then both receiving, as two
// workers of a 2-worker allreduce do. Layout "per-direction": each process sends on the
// connection it dialled and receives on the one it accepted (kf's layout: one connection per
// ordered pair, docs/design.md), with plain reads. Layout "peeked": the same connections read as
// kf reads them, with MSG_PEEK, the bytes dropped (MSG_TRUNC) only before the next read, after
// the next send. Layout "shared": one connection carries both directions (OpenMPI's TCP
// transport), with plain reads. The rounds alternate the layouts so that drift of the machine
// hits all three.
//
// Besides the time, each row gives the TCP segments the host sent per exchange (the Tcp OutSegs
// counter of /proc/net/snmp, which counts every process: run it on a quiet machine). On a
// connection that carries data one way only, the receiver answers with pure ACKs, sent from
// inside the call that empties the receive queue: the recv itself with plain reads, and the
// later drop when peeked.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// How long a receive may wait for the other process before the run is declared broken.
constexpr auto kStall = std::chrono::seconds(10);
constexpr int kWarmup = 1000;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// A socket that closes itself.
class Fd {
 public:
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

void no_delay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) fail("TCP_NODELAY");
}

// A listening socket on 127.0.0.1 and a port the kernel picked.
Fd listen_any(std::uint16_t& port) {
  Fd l(::socket(AF_INET, SOCK_STREAM, 0));
  if (l.get() < 0) fail("socket");
  sockaddr_in a = loopback(0);
  if (::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("bind 127.0.0.1:0");
  if (::listen(l.get(), 4) != 0) fail("listen");
  socklen_t n = sizeof a;
  if (::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &n) != 0) fail("getsockname");
  port = ntohs(a.sin_port);
  return l;
}

Fd dial(std::uint16_t port) {
  Fd s(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.get() < 0) fail("socket");
  sockaddr_in a = loopback(port);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    fail("connect 127.0.0.1:" + std::to_string(port));
  }
  no_delay(s.get());
  return s;
}

Fd accept_one(int l) {
  Fd s(::accept(l, nullptr, nullptr));
  if (s.get() < 0) fail("accept");
  no_delay(s.get());
  return s;
}

// The host's TCP segments sent so far (Tcp: OutSegs), or -1 where /proc/net/snmp is missing.
long long tcp_out_segments() {
  std::ifstream f("/proc/net/snmp");
  std::string names, values;
  while (std::getline(f, names) && std::getline(f, values)) {
    if (names.rfind("Tcp:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value) {
      if (name == "OutSegs") return std::stoll(value);
    }
  }
  return -1;
}

enum class Layout { per_direction, peeked, shared };
constexpr Layout kLayouts[] = {Layout::per_direction, Layout::peeked, Layout::shared};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::per_direction: return "per-direction";
    case Layout::peeked: return "peeked";
    case Layout::shared: return "shared";
  }
  return "?";
}

// What one side's receiving end carries from one exchange to the next: bytes read ahead into
// the next exchange, and (peeked) bytes that were taken but are still in the socket.
struct Reader {
  std::vector<char> in = std::vector<char>(64 * 1024);
  std::size_t extra = 0;
  bool peek = false;
  std::size_t peeked = 0;

  // Drops the bytes taken by peeking; they are there, so this never waits.
  void drop(int rx) {
    while (peeked > 0) {
      const ssize_t n = ::recv(rx, in.data(), peeked, MSG_TRUNC | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("recv (drop)");
      peeked -= std::min(peeked, static_cast<std::size_t>(n));
    }
  }
};

// Sends `bytes` on tx and takes `bytes` from rx, `count` times; polls without sleeping, as a
// worker waiting on a collective does.
void exchange(int tx, int rx, std::size_t bytes, int count, Reader& r) {
  const std::vector<char> out(bytes, 'k');
  for (int i = 0; i < count; ++i) {
    for (std::size_t sent = 0; sent < bytes;) {
      const ssize_t n = ::send(tx, out.data() + sent, bytes - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("send");
      sent += static_cast<std::size_t>(n);
    }
    r.drop(rx);
    auto give_up = Clock::time_point::max();
    for (unsigned idle = 0; r.extra < bytes;) {
      pollfd p{rx, POLLIN, 0};
      const int ready = ::poll(&p, 1, 0);
      if (ready < 0 && errno != EINTR) fail("poll");
      if (ready <= 0) {
        if (++idle % 1024 == 0) {
          const auto now = Clock::now();
          if (give_up == Clock::time_point::max()) give_up = now + kStall;
          if (now > give_up) throw std::runtime_error("the other process sent nothing for 10 s");
        }
        continue;
      }
      r.drop(rx);
      const ssize_t n =
          ::recv(rx, r.in.data(), r.in.size(), MSG_DONTWAIT | (r.peek ? MSG_PEEK : 0));
      if (n == 0) throw std::runtime_error("the other process closed the connection");
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) fail("recv");
      if (r.peek) r.peeked = static_cast<std::size_t>(n);
      r.extra += static_cast<std::size_t>(n);
      idle = 0;
      give_up = Clock::time_point::max();
    }
    r.extra -= bytes;
  }
}

struct Result {
  double us = 0;         // per exchange
  double segments = -1;  // TCP segments the host sent per exchange; < 0: unknown
};

// One round in one layout: forks the other process, warms up, times `iters` exchanges.
Result run_round(Layout layout, std::size_t bytes, int iters) {
  const bool shared = layout == Layout::shared;
  std::uint16_t p1 = 0, p2 = 0;
  Fd l1 = listen_any(p1);
  Fd l2 = shared ? Fd() : listen_any(p2);
  std::cout.flush();
  const pid_t child = ::fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    int code = 0;
    try {
      l1.reset();
      Fd to_parent = dial(p1);
      Fd from_parent = shared ? Fd() : accept_one(l2.get());
      const int rx = shared ? to_parent.get() : from_parent.get();
      Reader reader;
      reader.peek = layout == Layout::peeked;
      exchange(to_parent.get(), rx, bytes, kWarmup + iters, reader);
    } catch (const std::exception& e) {
      std::cerr << "kf-bench-tcp-pairs: the other process: " << e.what() << "\n";
      code = 1;
    }
    ::_exit(code);
  }
  Result r;
  std::string error;
  try {
    Fd from_child = accept_one(l1.get());
    Fd to_child = shared ? Fd() : dial(p2);
    const int tx = shared ? from_child.get() : to_child.get();
    Reader reader;
    reader.peek = layout == Layout::peeked;
    exchange(tx, from_child.get(), bytes, kWarmup, reader);
    const long long seg0 = tcp_out_segments();
    const auto t0 = Clock::now();
    exchange(tx, from_child.get(), bytes, iters, reader);
    const std::chrono::duration<double, std::micro> took = Clock::now() - t0;
    const long long seg1 = tcp_out_segments();
    r.us = took.count() / iters;
    if (seg0 >= 0 && seg1 >= seg0) r.segments = static_cast<double>(seg1 - seg0) / iters;
  } catch (const std::exception& e) {
    error = e.what();
    ::kill(child, SIGKILL);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!error.empty()) throw std::runtime_error(error);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("the other process failed");
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Measures a symmetric small exchange between two processes over loopback TCP, with one "
      "connection per direction (kf's layout) read plainly and read as kf reads it (peeked, "
      "dropped after the next send), and with one connection for both directions (OpenMPI's), "
      "in alternating rounds; prints the time and the TCP segments sent per exchange."};
  int iters = 100000;
  int rounds = 3;
  std::size_t bytes = 48;
  app.add_option("--iters", iters, "timed exchanges per round (after 1000 untimed)")
      ->check(CLI::Range(1, 100000000));
  app.add_option("--rounds", rounds, "rounds per layout")->check(CLI::Range(1, 1000));
  app.add_option("--bytes", bytes,
                 "message bytes each way (48: a kf frame of a 4-byte "
                 "allreduce)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  CLI11_PARSE(app, argc, argv);

  try {
    constexpr std::size_t kN = std::size(kLayouts);
    std::vector<double> us[kN], seg[kN];
    std::cout << "# kf-bench-tcp-pairs: " << bytes << " bytes each way, " << iters
              << " exchanges per round; segments: Tcp OutSegs of the whole host\n"
              << "# layout          round   us_per_exchange   segments_per_exchange\n";
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t l = 0; l < kN; ++l) {
        const Result res = run_round(kLayouts[l], bytes, iters);
        us[l].push_back(res.us);
        if (res.segments >= 0) seg[l].push_back(res.segments);
        std::printf("%-17s %5d   %15.3f   %21.2f\n", layout_name(kLayouts[l]), r + 1, res.us,
                    res.segments);
      }
    }
    for (std::size_t l = 0; l < kN; ++l) {
      std::printf("median %-13s     %15.3f   %21.2f\n", layout_name(kLayouts[l]), median(us[l]),
                  seg[l].empty() ? -1.0 : median(seg[l]));
    }
    static_assert(kLayouts[kN - 1] == Layout::shared);
    const double shared = median(us[kN - 1]);
    std::printf("per-direction / shared: %.2f\npeeked / shared: %.2f\n", median(us[0]) / shared,
                median(us[1]) / shared);
  } catch (const std::exception& e) {
    std::cerr << "kf-bench-tcp-pairs: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
