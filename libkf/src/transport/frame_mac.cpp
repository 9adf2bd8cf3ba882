// SPDX-License-Identifier: Apache-2.0
#include "transport/frame_mac.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kf/common/log.hpp"

namespace kf::transport {

Key connection_key(const Key& peers, const Nonce& challenge, const Nonce& hello,
                   const std::string& dialer, const std::string& acceptor) {
  std::string msg = "kf1-connection";
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(challenge.data()), challenge.size());
  msg.append(reinterpret_cast<const char*>(hello.data()), hello.size());
  msg += dialer;
  msg.push_back('\0');
  msg += acceptor;
  Key out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), peers.data(), static_cast<int>(peers.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

namespace {

bool use_vector(FrameMac::Kind kind) {
#if defined(__x86_64__)
  if (kind == FrameMac::Kind::vector) return Ghash::available();
  return kind == FrameMac::Kind::best && FrameMac::vector_checked();
#else
  (void)kind;
  return false;
#endif
}

// Tags of a few frames of each length under a fixed key, by `kind`.
std::vector<Tag> sample_tags(FrameMac::Kind kind) {
  Key key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(i * 29 + 1);
  FrameMac mac(key, kind);
  std::vector<Tag> tags;
  std::uint32_t x = 12345;
  for (const std::size_t n :
       {0u, 1u, 15u, 16u, 17u, 63u, 64u, 65u, 255u, 256u, 257u, 1000u, 4096u + 3u}) {
    std::vector<unsigned char> frame(n);
    for (auto& b : frame) {
      x = x * 1103515245u + 12345u;
      b = static_cast<unsigned char>(x >> 24);
    }
    mac.begin();
    // In two pieces, as a frame's header and payload come.
    const std::size_t cut = n / 3;
    mac.update(frame.data(), cut);
    mac.update(frame.data() + cut, n - cut);
    tags.push_back(mac.finish());
  }
  return tags;
}

}  // namespace

bool FrameMac::vector_checked() {
#if defined(__x86_64__)
  static const bool ok = [] {
    if (!Ghash::available()) return false;
    try {
      if (sample_tags(Kind::vector) == sample_tags(Kind::openssl)) return true;
      KF_LOG(err, "transport",
             "the vector GHASH gives other frame MACs than OpenSSL's AES-GCM on this processor: "
             "using OpenSSL's");
    } catch (const std::exception& e) {
      KF_LOG(err, "transport", "cannot check the vector GHASH ({}): using OpenSSL's AES-GCM",
             e.what());
    }
    return false;
  }();
  return ok;
#else
  return false;
#endif
}

FrameMac::FrameMac(const Key& key, Kind kind) : ctx_(EVP_CIPHER_CTX_new()) {
  const bool vector = use_vector(kind);
  if (ctx_ == nullptr || EVP_EncryptInit_ex(ctx_, vector ? EVP_aes_256_ecb() : EVP_aes_256_gcm(),
                                            nullptr, key.data(), nullptr) != 1) {
    EVP_CIPHER_CTX_free(ctx_);
    throw std::runtime_error("cannot set up frame authentication (OpenSSL AES failed)");
  }
#if defined(__x86_64__)
  if (vector) {
    EVP_CIPHER_CTX_set_padding(ctx_, 0);
    ghash_ = std::make_unique<Ghash>(encrypt_block(Block{}));
  }
#endif
}

Block FrameMac::encrypt_block(const Block& in) {
  Block out{};
  int len = 0;
  if (EVP_EncryptUpdate(ctx_, reinterpret_cast<unsigned char*>(out.data()), &len,
                        reinterpret_cast<const unsigned char*>(in.data()),
                        static_cast<int>(in.size())) != 1 ||
      len != static_cast<int>(out.size())) {
    throw std::runtime_error("frame authentication: OpenSSL AES failed");
  }
  return out;
}

FrameMac::~FrameMac() { EVP_CIPHER_CTX_free(ctx_); }

void FrameMac::begin() {
  // The 96-bit nonce: the frame's number on this connection, never repeated under its key.
  std::array<unsigned char, 12> iv{};
  for (std::size_t i = 0; i < 8; ++i) iv[i] = static_cast<unsigned char>(seq_ >> (8 * i));
  ++seq_;
  active_ = true;
#if defined(__x86_64__)
  if (ghash_) {
    // GCM's counter block for a 96-bit nonce: the nonce, then the 32-bit counter 1.
    Block j0{};
    std::memcpy(j0.data(), iv.data(), iv.size());
    j0[15] = std::byte{1};
    pad_ = encrypt_block(j0);
    ghash_->reset();
    return;
  }
#endif
  EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv.data());
}

void FrameMac::update(const void* data, std::size_t bytes) {
#if defined(__x86_64__)
  if (ghash_) {
    ghash_->update(data, bytes);
    return;
  }
#endif
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    // The bytes are authenticated, not encrypted: additional data, no output.
    const int n = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
    int out = 0;
    EVP_EncryptUpdate(ctx_, nullptr, &out, p, n);
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

Tag FrameMac::finish() {
  active_ = false;
#if defined(__x86_64__)
  if (ghash_) {
    const Block s = ghash_->finish();
    Tag tag{};
    for (std::size_t i = 0; i < tag.size(); ++i) tag[i] = s[i] ^ pad_[i];
    return tag;
  }
#endif
  unsigned char none[16];
  int out = 0;
  EVP_EncryptFinal_ex(ctx_, none, &out);
  Tag tag{};
  EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data());
  return tag;
}

bool tag_equal(const Tag& a, const Tag& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kf::transport
