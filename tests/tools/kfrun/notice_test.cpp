// SPDX-License-Identifier: Apache-2.0
// kfrun's notices: the signals a notice may come by, the time a notice's text gives, the notice
// file and the notice command (a real /bin/sh).
#include "kfrun/lib/notice.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace kf::tools {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST(NoticeSignal, TakesANameWithOrWithoutSigInAnyCaseOrANumber) {
  EXPECT_EQ(parse_notice_signal("USR1"), SIGUSR1);
  EXPECT_EQ(parse_notice_signal("SIGUSR2"), SIGUSR2);
  EXPECT_EQ(parse_notice_signal("sigterm"), SIGTERM);
  EXPECT_EQ(parse_notice_signal(" hup "), SIGHUP);
  EXPECT_EQ(parse_notice_signal(std::to_string(SIGUSR1)), SIGUSR1);
  EXPECT_EQ(signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signal_name(SIGKILL), "signal " + std::to_string(SIGKILL));
}

TEST(NoticeSignal, RefusesSignalsThatCannotBeANoticeAndNamesTheOption) {
  for (const char* bad : {"KILL", "SIGSTOP", "CHLD", "PIPE", "9", "", "USR3", "-10"}) {
    try {
      parse_notice_signal(bad);
      ADD_FAILURE() << "took '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--notice-signal '" + std::string(bad) + "'"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("USR1"), std::string::npos) << e.what();
    }
  }
}

TEST(NoticeTimeLeft, IsTheFirstLineAsWholeSeconds) {
  EXPECT_EQ(parse_time_left("120"), 120s);
  EXPECT_EQ(parse_time_left(" 30 \nmore text"), 30s);
  EXPECT_EQ(parse_time_left("0"), 0s);
  EXPECT_EQ(parse_time_left("86400"), 86400s);
  EXPECT_EQ(parse_time_left(""), std::nullopt);
  EXPECT_EQ(parse_time_left("\n30"), std::nullopt);
  EXPECT_EQ(parse_time_left("soon"), std::nullopt);
  EXPECT_EQ(parse_time_left("30s"), std::nullopt);
  EXPECT_EQ(parse_time_left("-5"), std::nullopt);
  EXPECT_EQ(parse_time_left("86401"), std::nullopt);
  EXPECT_EQ(parse_time_left("99999999999999999999"), std::nullopt);
}

class NoticeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kf-notice-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(NoticeFiles, AFileIsANoticeOnceItExistsAndItsFirstLineMayGiveTheTime) {
  const auto path = (dir_ / "notice").string();
  EXPECT_FALSE(read_notice_file(path));
  std::ofstream(path) << "";
  auto n = read_notice_file(path);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->source, "file " + path);
  EXPECT_EQ(n->time_left, std::nullopt);
  std::ofstream(path) << "45\n";
  n = read_notice_file(path);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->time_left, 45s);
}

TEST_F(NoticeFiles, ACommandIsANoticeWhenItExitsZero) {
  std::string problem;
  auto n = run_notice_command("echo 12", 5s, &problem);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->source, "command");
  EXPECT_EQ(n->time_left, 12s);
  EXPECT_EQ(problem, "");
  n = run_notice_command("true", 5s, &problem);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->time_left, std::nullopt);
  EXPECT_FALSE(run_notice_command("echo 12; exit 1", 5s, &problem));
  EXPECT_EQ(problem, "");
  // The command runs in the agent's environment, with signals at their defaults.
  EXPECT_TRUE(run_notice_command("test -e '" + dir_.string() + "'", 5s));
  EXPECT_FALSE(run_notice_command("test -e '" + (dir_ / "absent").string() + "'", 5s));
}

TEST_F(NoticeFiles, ACommandThatHangsIsKilledAndSaidToBeAProblem) {
  std::string problem;
  const auto began = std::chrono::steady_clock::now();
  // The shell and what it started: both are killed (a process group of their own).
  EXPECT_FALSE(run_notice_command("sleep 30 & wait", 300ms, &problem));
  EXPECT_LT(std::chrono::steady_clock::now() - began, 10s);
  EXPECT_NE(problem.find("ran longer than 300 ms"), std::string::npos) << problem;
  EXPECT_FALSE(run_notice_command("kill -9 $$", 5s, &problem));
  EXPECT_NE(problem.find("killed by signal 9"), std::string::npos) << problem;
}

TEST_F(NoticeFiles, ThePollerCallsBackOnceWhenTheFileAppears) {
  NoticeOptions options;
  options.file = (dir_ / "notice").string();
  options.poll = 10ms;
  std::mutex mutex;
  std::condition_variable cv;
  int calls = 0;
  std::optional<Notice> seen;
  auto poller = std::make_unique<NoticePoller>(
      options,
      [&](Notice n) {
        std::lock_guard lock(mutex);
        ++calls;
        seen = n;
        cv.notify_all();
      },
      [](const std::string&) {});
  // Written whole and renamed into place, as docs/kfrun.md asks of a side script: the poller
  // may look at any moment.
  std::ofstream(*options.file + ".new") << "7\n";
  fs::rename(*options.file + ".new", *options.file);
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return calls > 0; }));
  }
  poller.reset();  // joins its thread: every call it would make has been made
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen->time_left, 7s);
}

}  // namespace
}  // namespace kf::tools
