// SPDX-License-Identifier: Apache-2.0
// The validation of a job file's document (docs/job-file.md; validation.cpp), which
// kf::parse_job_file (job_file.cpp) runs once the text has been read into one. Private to the
// runtime: yaml-cpp stays out of the public headers. Thread-safety: a free function.
#pragma once

#include <string>

#include <yaml-cpp/node/node.h>

#include "kf/runtime/job_file.hpp"

namespace kf::detail {

/// The job file whose document is `root` (a null node for a file that holds none), read from
/// `source_name`, with every key and value checked. Throws: JobFileError naming the source, the
/// line, the key path and what was expected.
JobFile read_job_document(const YAML::Node& root, const std::string& source_name);

}  // namespace kf::detail
