// SPDX-License-Identifier: Apache-2.0
// Reading the job token from its file (what is taken, what is refused, the warning about a
// file that others may read), the cluster document from the environment or its file, and a
// variable's range.
#include "kf/common/env.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kf/peer.hpp"
#include "support/log_capture.hpp"

namespace kf {
namespace {

namespace fs = std::filesystem;

class EnvFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kf-env-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p.string();
  }
  std::string error_of(const std::string& path) {
    try {
      read_token_file(path);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(EnvFile, TakesTheFirstLineWithoutTrailingSpaceOrCarriageReturn) {
  EXPECT_EQ(read_token_file(write("a", "s3cret \r\nsecond line\n")), "s3cret");
  EXPECT_EQ(read_token_file(write("b", "no-newline")), "no-newline");
}

TEST_F(EnvFile, RefusesWhatIsNoToken) {
  EXPECT_NE(error_of(write("empty", "\n")).find("is empty"), std::string::npos);
  EXPECT_NE(error_of((dir_ / "absent").string()).find("cannot read job token file"),
            std::string::npos);
  EXPECT_NE(error_of(dir_.string()).find("is not a regular file"), std::string::npos);
  const std::string huge = write("huge", std::string(5000, 'x') + "\n");
  EXPECT_NE(error_of(huge).find("the first line is longer than 4096 bytes"), std::string::npos)
      << error_of(huge);
  EXPECT_EQ(read_token_file(write("long", std::string(4096, 'y') + "\n")).size(), 4096u);
}

TEST_F(EnvFile, WarnsOnceWhenOthersMayReadIt) {
  test::LogCapture log;
  const std::string token = "kw7DqS2mZ0pYvB5nLx8rT1eH4cUoGa9f\n";
  const std::string open_to_all = write("all", token, 0644);
  const std::string open_to_group = write("group", token, 0640);
  const std::string private_file = write("private", token, 0600);
  for (int i = 0; i < 2; ++i) {
    read_token_file(open_to_all);
    read_token_file(open_to_group);
    read_token_file(private_file);
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("job token file '" + open_to_all + "' may be read by every user (mode 644)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("job token file '" + open_to_group + "' may be read by its group (mode 640)"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find(private_file), std::string::npos) << text;
  EXPECT_EQ(text.find(open_to_all), text.rfind(open_to_all)) << "warned twice: " << text;
}

TEST_F(EnvFile, WarnsOnceAboutAShortToken) {
  test::LogCapture log;
  const std::string short_token = write("short", "s3cret\n", 0600);
  const std::string long_token = write("long", "kw7DqS2mZ0pYvB5n\n", 0600);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(read_token_file(short_token), "s3cret");
    read_token_file(long_token);
  }
  const std::string text = log.text();
  EXPECT_NE(text.find("job token file '" + short_token + "' holds a token of 6 bytes"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find(long_token), std::string::npos) << text;
  EXPECT_EQ(text.find(short_token), text.rfind(short_token)) << "warned twice: " << text;
}

// The worker's reading of its environment: the cluster document inline or, too large for the
// environment, from the file kfrun names.
TEST_F(EnvFile, TheClusterComesInlineOrFromAFile) {
  const std::string doc =
      R"({"version":3,"workers":[{"host":"127.0.0.1","port":9001,"slot":0}],"settings":{}})";
  const std::string file = write("cluster.json", doc + "\n");
  ::setenv("KF_SELF", "127.0.0.1:9001", 1);
  ::setenv("KF_JOB_TOKEN", "t", 1);
  ::unsetenv("KF_CLUSTER");
  ::setenv("KF_CLUSTER_FILE", file.c_str(), 1);
  EXPECT_EQ(Env::from_environment().cluster.version, 3u);
  ::setenv("KF_CLUSTER", R"({"version":4,"workers":[{"host":"127.0.0.1","port":9001,"slot":0}]})",
           1);
  EXPECT_EQ(Env::from_environment().cluster.version, 4u) << "KF_CLUSTER comes first";
  ::unsetenv("KF_CLUSTER");
  ::setenv("KF_CLUSTER_FILE", (dir_ / "absent.json").c_str(), 1);
  try {
    Env::from_environment();
    ADD_FAILURE() << "a missing cluster file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("KF_CLUSTER_FILE: '" + (dir_ / "absent.json").string() +
                                         "' cannot be read"),
              std::string::npos)
        << e.what();
  }
  ::setenv("KF_CLUSTER_FILE", write("bad.json", "{\"version\": 1").c_str(), 1);
  EXPECT_THROW(Env::from_environment(), std::invalid_argument);
  ::unsetenv("KF_CLUSTER_FILE");
  try {
    Env::from_environment();
    ADD_FAILURE() << "no cluster was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "neither KF_CLUSTER nor KF_CLUSTER_FILE is set");
  }
  ::unsetenv("KF_SELF");
  ::unsetenv("KF_JOB_TOKEN");
}

// The variables every Env needs, set for one test and unset after it.
class EnvVariables : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("KF_SELF", "127.0.0.1:9001", 1);
    ::setenv("KF_JOB_TOKEN", "t", 1);
    ::setenv("KF_CLUSTER", R"({"version":1,"workers":[{"host":"127.0.0.1","port":9001,"slot":0}]})",
             1);
  }
  void TearDown() override {
    ::unsetenv("KF_CLUSTER");
    ::unsetenv("KF_SELF");
    ::unsetenv("KF_JOB_TOKEN");
  }
  // Each of `bad` as the value of `name` is refused with a message that names the variable;
  // `name` is unset after.
  static void expect_refused(const char* name, std::initializer_list<const char*> bad) {
    for (const char* value : bad) {
      ::setenv(name, value, 1);
      try {
        Env::from_environment();
        ADD_FAILURE() << name << "='" << value << "' was accepted";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
    ::unsetenv(name);
  }
};

TEST_F(EnvVariables, RecoveryWriterWaitTakesZeroAndRefusesWhatIsNoDuration) {
  ::setenv("KF_RECOVERY_WRITER_WAIT_MS", "0", 1);
  EXPECT_EQ(Env::from_environment().recovery_writer_wait, std::chrono::milliseconds(0));
  ::setenv("KF_RECOVERY_WRITER_WAIT_MS", "40", 1);
  EXPECT_EQ(Env::from_environment().recovery_writer_wait, std::chrono::milliseconds(40));
  expect_refused("KF_RECOVERY_WRITER_WAIT_MS", {"-1", "soon", "3600001"});
  EXPECT_FALSE(Env::from_environment().recovery_writer_wait);
}

TEST_F(EnvVariables, SummaryIntervalIsMillisecondsAndZeroTurnsSummariesOff) {
  EXPECT_FALSE(Env::from_environment().summary_interval);
  ::setenv("KF_SUMMARY_INTERVAL_MS", "0", 1);
  EXPECT_EQ(Env::from_environment().summary_interval, std::chrono::milliseconds(0));
  expect_refused("KF_SUMMARY_INTERVAL_MS", {"-1", "soon", "86400001"});
}

TEST_F(EnvVariables, ConnectTimeoutIsMillisecondsFromOneToAnHour) {
  EXPECT_FALSE(Env::from_environment().connect_timeout);
  ::setenv("KF_CONNECT_TIMEOUT_MS", "3600000", 1);
  EXPECT_EQ(Env::from_environment().connect_timeout, std::chrono::milliseconds(3600000));
  ::setenv("KF_CONNECT_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(Peer::options_from(Env::from_environment()).connect_timeout,
            std::chrono::milliseconds(1500));
  expect_refused("KF_CONNECT_TIMEOUT_MS", {"0", "-5", "later", "3600001"});
}

TEST_F(EnvVariables, BoundaryIntervalIsAPositiveNumberOfMilliseconds) {
  EXPECT_FALSE(Env::from_environment().boundary_interval);
  ::setenv("KF_BOUNDARY_INTERVAL_MS", "250", 1);
  EXPECT_EQ(Env::from_environment().boundary_interval, std::chrono::milliseconds(250));
  expect_refused("KF_BOUNDARY_INTERVAL_MS", {"0", "-5", "often", "86400001"});
}

}  // namespace
}  // namespace kf
