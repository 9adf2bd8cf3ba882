// SPDX-License-Identifier: Apache-2.0
#include "transport/auth.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace kf::transport {

Nonce random_nonce() {
  Nonce n;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    throw std::runtime_error("OpenSSL RAND_bytes failed");
  }
  return n;
}

Mac handshake_mac(const Key& key, const char* purpose, const std::string& job_id,
                  const std::string& identity, const Nonce& nonce) {
  // Fields are joined with NUL separators so that ("ab","c") and ("a","bc") differ.
  std::string msg = std::string("kf1-") + purpose;
  msg.push_back('\0');
  msg += job_id;
  msg.push_back('\0');
  msg += identity;
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  Mac out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
       reinterpret_cast<unsigned char*>(out.data()), &len);
  return out;
}

std::string handshake_purpose(bool hello, bool frame_auth, bool tcp) {
  std::string p = hello ? "hello" : "welcome";
  if (frame_auth) p += "+frame-mac";
  p += tcp ? "+tcp" : "+same-host";
  return p;
}

Mac hello_mac(const Key& key, bool frame_auth, bool tcp, const std::string& job_id,
              const std::string& identity, const std::string& to, const Nonce& nonce) {
  // The acceptor meant goes with the identity, NUL-separated like the other fields.
  std::string subject = identity;
  subject.push_back('\0');
  subject += to;
  return handshake_mac(key, handshake_purpose(true, frame_auth, tcp).c_str(), job_id, subject,
                       nonce);
}

Mac welcome_mac(const Key& key, bool frame_auth, bool tcp, const std::string& job_id,
                const std::string& identity, const Nonce& nonce) {
  return handshake_mac(key, handshake_purpose(false, frame_auth, tcp).c_str(), job_id, identity,
                       nonce);
}

bool mac_equal(const Mac& a, const Mac& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

namespace {

void put_str(std::vector<std::byte>& out, const std::string& s) {
  const auto n = static_cast<std::uint16_t>(std::min<std::size_t>(s.size(), 0xffff));
  out.push_back(static_cast<std::byte>(n & 0xff));
  out.push_back(static_cast<std::byte>(n >> 8));
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(s[i]));
}

template <std::size_t N>
void put_arr(std::vector<std::byte>& out, const std::array<std::byte, N>& a) {
  out.insert(out.end(), a.begin(), a.end());
}

class Reader {
 public:
  explicit Reader(const std::vector<std::byte>& b) : b_(b) {}
  bool str(std::string& s) {
    if (pos_ + 2 > b_.size()) return false;
    const std::size_t n =
        static_cast<std::size_t>(b_[pos_]) | (static_cast<std::size_t>(b_[pos_ + 1]) << 8);
    pos_ += 2;
    if (pos_ + n > b_.size()) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  template <std::size_t N>
  bool arr(std::array<std::byte, N>& a) {
    if (pos_ + N > b_.size()) return false;
    std::memcpy(a.data(), b_.data() + pos_, N);
    pos_ += N;
    return true;
  }
  bool flag(bool& f) {
    if (pos_ + 1 > b_.size() || static_cast<unsigned>(b_[pos_]) > 1) return false;
    f = b_[pos_++] == std::byte{1};
    return true;
  }
  bool at_end() const { return pos_ == b_.size(); }

 private:
  const std::vector<std::byte>& b_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> encode(const Hello& h) {
  std::vector<std::byte> out;
  put_str(out, h.job_id);
  put_str(out, h.identity);
  put_arr(out, h.nonce);
  put_arr(out, h.mac);
  out.push_back(static_cast<std::byte>(h.frame_auth ? 1 : 0));
  return out;
}

std::vector<std::byte> encode(const Welcome& w) {
  std::vector<std::byte> out;
  put_str(out, w.identity);
  put_arr(out, w.mac);
  out.push_back(static_cast<std::byte>(w.frame_auth ? 1 : 0));
  return out;
}

std::optional<Hello> decode_hello(const std::vector<std::byte>& payload) {
  Reader r(payload);
  Hello h;
  if (!r.str(h.job_id) || !r.str(h.identity) || !r.arr(h.nonce) || !r.arr(h.mac) ||
      !r.flag(h.frame_auth) || !r.at_end()) {
    return std::nullopt;
  }
  return h;
}

std::optional<Welcome> decode_welcome(const std::vector<std::byte>& payload) {
  Reader r(payload);
  Welcome w;
  if (!r.str(w.identity) || !r.arr(w.mac) || !r.flag(w.frame_auth) || !r.at_end()) {
    return std::nullopt;
  }
  return w;
}

}  // namespace kf::transport
