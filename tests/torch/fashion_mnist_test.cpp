// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST example's data reading: the real files (when dataset-fashion-mnist is
// installed), and every kind of bad file, each a clear error naming the file; and the example
// itself exiting 1 with that message when its data is missing or corrupt.
#include "fashion_mnist/idx.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace {

namespace fs = std::filesystem;

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string d = (fs::temp_directory_path() / "kf-idx-XXXXXX").string();
    ASSERT_NE(::mkdtemp(d.data()), nullptr);
    dir_ = d;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An IDX file of unsigned bytes with `dims`, holding `payload` bytes (gzip when gz).
  void write(const std::string& name, std::vector<std::uint32_t> dims, std::size_t payload, bool gz,
             std::uint32_t magic = 0) {
    std::string bytes;
    const auto put = [&](std::uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((v >> s) & 0xff));
    };
    put(magic != 0 ? magic : 0x0800u | static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) put(d);
    for (std::size_t i = 0; i < payload; ++i) bytes.push_back(static_cast<char>(i % 10));
    const auto path = (dir_ / name).string();
    if (gz) {
      gzFile f = ::gzopen(path.c_str(), "wb");
      ::gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      ::gzclose(f);
    } else {
      std::ofstream(path, std::ios::binary) << bytes;
    }
  }
  std::string error_of(const std::string& prefix) {
    try {
      fmnist::read_split(dir_.string(), prefix);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(no error)";
  }

  fs::path dir_;
};

TEST_F(IdxFiles, ReadsGzipAndPlainFiles) {
  write("train-images-idx3-ubyte.gz", {3, 28, 28}, 3 * 784, true);
  write("train-labels-idx1-ubyte", {3}, 3, false);
  const auto s = fmnist::read_split(dir_.string(), "train");
  EXPECT_EQ(s.images.count, 3u);
  EXPECT_EQ(s.images.pixels.size(), 3u * 784);
  EXPECT_EQ(s.labels, (std::vector<std::uint8_t>{0, 1, 2}));
}

TEST_F(IdxFiles, EveryBadFileIsNamedWithWhatIsWrong) {
  EXPECT_NE(error_of("train").find("train-images-idx3-ubyte.gz: no such file"), std::string::npos)
      << error_of("train");
  write("train-images-idx3-ubyte.gz", {3, 28, 28}, 3 * 784 - 5, true);  // truncated
  write("train-labels-idx1-ubyte.gz", {3}, 3, true);
  EXPECT_NE(error_of("train").find("truncated or corrupt"), std::string::npos) << error_of("train");
  write("train-images-idx3-ubyte.gz", {3, 28, 28}, 3 * 784, true, 0x12345678);  // bad magic
  EXPECT_NE(error_of("train").find("magic 0x12345678"), std::string::npos) << error_of("train");
  write("train-images-idx3-ubyte.gz", {3, 28, 28}, 3 * 784, true);
  write("train-labels-idx1-ubyte.gz", {4}, 4, true);  // one label too many
  EXPECT_NE(error_of("train").find("4 labels for 3 images"), std::string::npos)
      << error_of("train");
  std::ofstream(dir_ / "train-labels-idx1-ubyte.gz", std::ios::binary) << "\x1f\x8bnot gzip";
  EXPECT_NE(error_of("train").find("train-labels-idx1-ubyte.gz"), std::string::npos)
      << error_of("train");
}

TEST(FashionMnistData, TheInstalledDataSetHasItsKnownShape) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " is missing (package dataset-fashion-mnist)";
  const auto train = fmnist::read_split(dir, "train");
  const auto test = fmnist::read_split(dir, "t10k");
  EXPECT_EQ(train.images.count, 60000u);
  EXPECT_EQ(test.images.count, 10000u);
  EXPECT_EQ(train.images.rows, 28u);
  EXPECT_EQ(train.images.cols, 28u);
}

TEST(FashionMnistExample, MissingDataIsAClearErrorAndExit1) {
  const char* exe = std::getenv("KF_FASHION_MNIST");
  if (exe == nullptr) GTEST_SKIP() << "KF_FASHION_MNIST (the example's path) is not set";
  const auto r = kf::test::run_shell(std::string(exe) + " --data /nonexistent/fmnist");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/fmnist/train-images-idx3-ubyte.gz: no such file"),
            std::string::npos)
      << r.output;
  const auto bad = kf::test::run_shell(std::string(exe) + " --model transformer");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--model"), std::string::npos) << bad.output;
}

}  // namespace
