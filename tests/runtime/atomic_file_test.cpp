// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/atomic_file.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace kf {
namespace {

class AtomicFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "kf-atomic-file-XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Entries of the folder other than `keep`.
  std::vector<std::string> others(const std::string& keep) const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != keep) v.push_back(e.path().filename().string());
    }
    return v;
  }

  fs::path dir_;
};

TEST_F(AtomicFile, ReplacesTheFileWithThePiecesAndLeavesNoTemporary) {
  const fs::path file = dir_ / "state";
  write_file_atomically(file, {"old"}, 0600);
  write_file_atomically(file, {"new ", "", "content"}, 0640);
  EXPECT_EQ(read(file), "new content");
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_TRUE(others("state").empty());
}

TEST_F(AtomicFile, AFileOrLinkPlantedWhereTemporariesGoIsNeverWrittenThrough) {
  // A link at the fixed temporary name of old versions, pointing elsewhere: the write must not
  // follow it (the temporary's name is fresh each time, and created exclusively).
  const fs::path victim = dir_ / "victim";
  { std::ofstream(victim) << "untouched"; }
  const fs::path file = dir_ / "state";
  fs::create_symlink(victim, file.string() + ".tmp");
  write_file_atomically(file, {"written"}, 0600);
  EXPECT_EQ(read(file), "written");
  EXPECT_EQ(read(victim), "untouched");
  EXPECT_TRUE(fs::is_symlink(file.string() + ".tmp"));
}

TEST_F(AtomicFile, AFailureBeforeTheRenameLeavesTheOldContentAndSaysWhichStep) {
  const fs::path file = dir_ / "missing" / "state";
  try {
    write_file_atomically(file, {"x"}, 0600);
    FAIL() << "wrote into a folder that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot create '" + file.string() + ".tmp-", 0), 0u)
        << e.what();
  }
  // A folder that is not writable (unless this runs as root, which may write anyway).
  if (::geteuid() != 0) {
    const fs::path ro = dir_ / "ro";
    fs::create_directory(ro);
    write_file_atomically(ro / "state", {"old"}, 0600);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(write_file_atomically(ro / "state", {"new"}, 0600), std::runtime_error);
    fs::permissions(ro, fs::perms::owner_all);
    EXPECT_EQ(read(ro / "state"), "old");
  }
}

}  // namespace
}  // namespace kf
