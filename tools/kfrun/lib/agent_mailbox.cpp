// SPDX-License-Identifier: Apache-2.0
// The agent link's Mailbox (messages from the link threads to the agent's loop, with a wake-up
// pipe) and Outage (an unreachable service told once per outage). agent_link.hpp declares them.
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <system_error>
#include <utility>

#include "kfrun/lib/agent_link.hpp"  // declares Mailbox and Outage

namespace kf::tools {

Mailbox::Mailbox() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "kfrun: pipe2");
  }
  read_ = UniqueFd(fds[0]);
  write_ = UniqueFd(fds[1]);
}

void Mailbox::post(LinkMessage message) {
  {
    std::lock_guard lock(mutex_);
    messages_.push_back(std::move(message));
  }
  // A full pipe already holds a wake-up.
  const char byte = 1;
  [[maybe_unused]] auto n = ::write(write_.get(), &byte, 1);
}

std::vector<LinkMessage> Mailbox::take() {
  std::array<char, 256> bytes;
  while (::read(read_.get(), bytes.data(), bytes.size()) > 0) {
  }
  std::lock_guard lock(mutex_);
  return std::exchange(messages_, {});
}

void Outage::down(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (std::exchange(down_, true)) return;
  }
  mailbox_->post(LinkNote{"config service unreachable (" + why +
                          "); keeping the workers running and retrying"});
}

void Outage::up() {
  {
    std::lock_guard lock(mutex_);
    if (!std::exchange(down_, false)) return;
  }
  mailbox_->post(LinkNote{"config service reachable again"});
}

}  // namespace kf::tools
