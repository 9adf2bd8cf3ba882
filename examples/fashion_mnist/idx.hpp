// SPDX-License-Identifier: Apache-2.0
// Reading the Fashion-MNIST (and MNIST) IDX files, gzip-compressed or not: idx3 images (unsigned
// bytes, N × rows × cols) and idx1 labels. Every problem — a missing file, a bad magic number,
// dimensions that do not fit, a truncated file — is a std::runtime_error naming the file and
// what was wrong. No LibTorch here: the example turns the bytes into tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fmnist {

struct Images {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  ///< count × rows × cols, row-major
};

struct Split {
  Images images;
  std::vector<std::uint8_t> labels;  ///< one per image, 0..9
};

/// Reads `path` (an .gz file is decompressed). Throws: std::runtime_error naming the file.
Images read_images(const std::string& path);
std::vector<std::uint8_t> read_labels(const std::string& path);

/// The "train" or "t10k" split from `dir`: {prefix}-images-idx3-ubyte(.gz) and
/// {prefix}-labels-idx1-ubyte(.gz). Throws: std::runtime_error naming the missing or bad file,
/// or images and labels of different counts, or a label above 9.
Split read_split(const std::string& dir, const std::string& prefix);

}  // namespace fmnist
