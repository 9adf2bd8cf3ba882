// SPDX-License-Identifier: Apache-2.0
// What kf logs while a LogCapture lives, readable while other threads go on logging (under the
// sink's own lock).
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <memory>
#include <mutex>
#include <string>

#include "kf/common/log.hpp"

namespace kf::test {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<StringSink>()) { logger().sinks().push_back(sink_); }
  ~LogCapture() { std::erase(logger().sinks(), sink_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() { return sink_->text(); }

 private:
  class StringSink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string text() {
      std::lock_guard<std::mutex> lock(mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t line;
      formatter_->format(msg, line);
      text_.append(line.data(), line.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };
  std::shared_ptr<StringSink> sink_;
};

}  // namespace kf::test
