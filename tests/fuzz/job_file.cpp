// SPDX-License-Identifier: Apache-2.0
// The YAML job file (kf/runtime/job_file.hpp): any text either validates or is refused with a
// JobFileError naming the file; nothing else escapes. Time and memory are bounded by the
// runner's -timeout and -rss_limit_mb (aliases must not expand without bound).
#include <exception>

#include "check.hpp"
#include "kf/runtime/job_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const kf::JobFile f = kf::parse_job_file(text, "fuzz.yaml");
    (void)f.to_settings().dump();
  } catch (const kf::JobFileError& e) {
    KF_FUZZ_CHECK(std::string_view(e.what()).starts_with("fuzz.yaml"), e.what());
  } catch (const std::exception& e) {
    KF_FUZZ_CHECK(false, std::string("not a JobFileError: ") + e.what());
  }
  return 0;
}
