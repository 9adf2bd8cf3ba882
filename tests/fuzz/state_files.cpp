// SPDX-License-Identifier: Apache-2.0
// State files: the config service's (kf-config-server/lib/state.hpp: its snapshot, or its log
// after an empty snapshot) and kf::State's checkpoints (kf/runtime/state.hpp). Whatever the file
// holds, loading it either succeeds or throws std::runtime_error naming a state file; nothing
// else escapes, and a kf::State that refused a file keeps its buffers as they were.
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "kf-config-server/lib/state.hpp"
#include "kf/coll/types.hpp"
#include "kf/runtime/state.hpp"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const fs::path file = kf::fuzz::scratch_dir() / "state";
  const fs::path log = kf::config_server::log_file(file);
  // With bit 1 the input is the config service's log (and there is no snapshot).
  const bool as_log = (data[0] & 3) == 3;
  std::error_code ignored;
  fs::remove(as_log ? file : log, ignored);
  {
    std::ofstream out(as_log ? log : file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  if (data[0] & 1) {
    try {
      const auto s = kf::config_server::load_state(file);
      (void)s.to_json().dump();
    } catch (const std::runtime_error& e) {
      KF_FUZZ_CHECK(std::string_view(e.what()).find(file.string()) != std::string_view::npos,
                    e.what());
    } catch (const std::exception& e) {
      KF_FUZZ_CHECK(false, std::string("not a runtime_error: ") + e.what());
    }
    return 0;
  }
  // A layout like a small model's: two buffers of different types and a counter.
  std::vector<float> w(8, 1.5f);
  std::vector<std::int32_t> n(3, 7);
  kf::State state;
  state.add("w", kf::buffer(w.data(), w.size()));
  state.add("n", kf::buffer(n.data(), n.size()));
  state.counter("step") = 42;
  try {
    state.load(file.string());
  } catch (const std::runtime_error& e) {
    KF_FUZZ_CHECK(std::string_view(e.what()).find(file.string()) != std::string_view::npos,
                  e.what());
    KF_FUZZ_CHECK(w == std::vector<float>(8, 1.5f) && n == std::vector<std::int32_t>(3, 7) &&
                      state.counter("step") == 42,
                  std::string("a refused file changed the buffers: ") + e.what());
  } catch (const std::exception& e) {
    KF_FUZZ_CHECK(false, std::string("not a runtime_error: ") + e.what());
  }
  return 0;
}
