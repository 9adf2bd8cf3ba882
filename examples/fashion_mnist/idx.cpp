// SPDX-License-Identifier: Apache-2.0
#include "idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace fmnist {

namespace {

// The whole file, decompressed when it is gzip (zlib reads plain files unchanged too).
std::vector<std::uint8_t> read_all(const std::string& path) {
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw std::runtime_error(
        path + ": cannot open: " + (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  std::vector<std::uint8_t> data;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    const int n = ::gzread(f, chunk, sizeof chunk);
    if (n < 0) {
      int code = 0;
      const std::string why = ::gzerror(f, &code);
      ::gzclose(f);
      throw std::runtime_error(path + ": cannot read: " + why + " (corrupt or truncated?)");
    }
    if (n == 0) break;
    data.insert(data.end(), chunk, chunk + n);
  }
  ::gzclose(f);
  return data;
}

std::uint32_t big_endian(const std::vector<std::uint8_t>& d, std::size_t at) {
  return static_cast<std::uint32_t>(d[at]) << 24 | static_cast<std::uint32_t>(d[at + 1]) << 16 |
         static_cast<std::uint32_t>(d[at + 2]) << 8 | d[at + 3];
}

// The header's dimensions after checking the magic number (unsigned bytes, `dims` dimensions).
std::vector<std::size_t> header(const std::vector<std::uint8_t>& d, const std::string& path,
                                std::uint32_t dims) {
  const std::size_t need = 4 + 4 * static_cast<std::size_t>(dims);
  if (d.size() < need) {
    throw std::runtime_error(path + ": too short for an IDX header (" + std::to_string(d.size()) +
                             " bytes)");
  }
  const std::uint32_t magic = big_endian(d, 0);
  if (magic != (0x0800u | dims)) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    throw std::runtime_error(path + ": not an IDX file of unsigned bytes with " +
                             std::to_string(dims) + " dimensions (magic " + hex + ")");
  }
  std::vector<std::size_t> n;
  std::size_t total = 1;
  for (std::uint32_t i = 0; i < dims; ++i) {
    n.push_back(big_endian(d, 4 + 4 * i));
    total *= n.back();
  }
  if (d.size() != need + total) {
    throw std::runtime_error(path + ": holds " + std::to_string(d.size() - need) +
                             " data bytes, its header says " + std::to_string(total) +
                             " (truncated or corrupt)");
  }
  return n;
}

std::string find(const std::string& dir, const std::string& name) {
  const auto plain = std::filesystem::path(dir) / name;
  const auto gz = std::filesystem::path(dir) / (name + ".gz");
  if (std::filesystem::exists(gz)) return gz.string();
  if (std::filesystem::exists(plain)) return plain.string();
  throw std::runtime_error(gz.string() + ": no such file (nor " + plain.string() +
                           "); install dataset-fashion-mnist or pass --data DIR");
}

}  // namespace

Images read_images(const std::string& path) {
  const auto d = read_all(path);
  const auto n = header(d, path, 3);
  Images im;
  im.count = n[0];
  im.rows = n[1];
  im.cols = n[2];
  im.pixels.assign(d.begin() + 16, d.end());
  return im;
}

std::vector<std::uint8_t> read_labels(const std::string& path) {
  const auto d = read_all(path);
  header(d, path, 1);
  return {d.begin() + 8, d.end()};
}

Split read_split(const std::string& dir, const std::string& prefix) {
  const std::string images_path = find(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find(dir, prefix + "-labels-idx1-ubyte");
  Split s;
  s.images = read_images(images_path);
  s.labels = read_labels(labels_path);
  if (s.labels.size() != s.images.count) {
    throw std::runtime_error(labels_path + ": " + std::to_string(s.labels.size()) + " labels for " +
                             std::to_string(s.images.count) + " images in " + images_path);
  }
  for (std::size_t i = 0; i < s.labels.size(); ++i) {
    if (s.labels[i] > 9) {
      throw std::runtime_error(labels_path + ": label " + std::to_string(s.labels[i]) +
                               " of image " + std::to_string(i) + " is not a class 0..9");
    }
  }
  return s;
}

}  // namespace fmnist
