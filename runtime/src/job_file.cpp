// SPDX-License-Identifier: Apache-2.0
// Loading the job file (docs/job-file.md): its text checked and read into one YAML document,
// which job_file/validation.cpp validates; JobFileError; and the settings a job file gives the
// cluster.
#include "kf/runtime/job_file.hpp"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>
#include <system_error>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "job_file/validation.hpp"
#include "kf/common/utf8.hpp"

namespace kf {
namespace {

std::string format_error(const std::string& source, int line, const std::string& key,
                         const std::string& reason) {
  std::string s = source;
  if (line > 0) s += ":" + std::to_string(line);
  s += ": ";
  if (!key.empty()) s += key + ": ";
  return s + reason;
}

}  // namespace

JobFileError::JobFileError(std::string source, int line, std::string key, const std::string& reason)
    : std::runtime_error(format_error(source, line, key, reason)),
      source_(std::move(source)),
      line_(line),
      key_(std::move(key)) {}

nlohmann::json JobFile::to_settings() const {
  nlohmann::json s = {{"algorithm", std::string(to_string(algorithm))},
                      {"batch_size", batch_size},
                      {"lr", learning_rate},
                      {"min_workers", workers.min},
                      {"max_workers", workers.max}};
  if (mode) s["mode"] = mode->str();
  if (compression) s["compression"] = compression->str();
  if (autoscale) s["autoscale"] = autoscale->to_json();
  if (spares > 0) s["spares"] = spares;
  return s;
}

namespace {

// The offset of the first byte that is not YAML text: not part of well-formed UTF-8, or a
// control character other than tab, line feed and carriage return (which YAML does not allow,
// and which make yaml-cpp guess another encoding: a NUL reads as UTF-16). npos when there is none.
std::size_t first_non_yaml_byte(std::string_view s) {
  std::size_t bad = first_invalid_utf8(s);
  for (std::size_t i = 0; i < std::min(bad, s.size()); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return i;
  }
  return bad;
}

// Counts the documents of a stream and notes where the second starts.
struct DocumentCounter : YAML::EventHandler {
  int documents = 0;
  int second_line = 0;
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents == 2) second_line = mark.line + 1;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

JobFile parse_job_file(const std::string& yaml_text, const std::string& source_name) {
  // YAML is Unicode text; kf keeps its strings in JSON, which must be UTF-8.
  if (const auto bad = first_non_yaml_byte(yaml_text); bad != std::string_view::npos) {
    const auto line = 1 + std::count(yaml_text.begin(),
                                     yaml_text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
    throw JobFileError(
        source_name, static_cast<int>(line), "",
        "not UTF-8 text without control characters (byte " + std::to_string(bad + 1) + ")");
  }
  std::vector<YAML::Node> docs;
  int second_line = 0;  // where a second document starts, when there is one
  try {
    // Documents are counted up to two, not loaded all: on some malformed streams (a stray
    // directive) yaml-cpp's LoadAll returns empty documents without end, until memory runs out.
    std::istringstream stream(yaml_text);
    YAML::Parser parser(stream);
    DocumentCounter counter;
    while (counter.documents < 2 && parser.HandleNextDocument(counter)) {
    }
    second_line = counter.second_line;
    if (counter.documents > 0) docs.push_back(YAML::Load(yaml_text));
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    const std::string column =
        e.mark.is_null() ? "" : " (column " + std::to_string(e.mark.column + 1) + ")";
    throw JobFileError(source_name, line, "", "malformed YAML: " + e.msg + column);
  }
  if (second_line > 0) {
    throw JobFileError(source_name, second_line, "",
                       "a job file holds one YAML document, found more (remove the extra '---')");
  }
  return detail::read_job_document(docs.empty() ? YAML::Node() : docs[0], source_name);
}

JobFile load_job_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw JobFileError(path, 0, "", "is a directory, not a job file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw JobFileError(path, 0, "",
                       "cannot open the job file: " + std::system_category().message(errno));
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw JobFileError(path, 0, "", "cannot read the job file");
  JobFile job = parse_job_file(text, path);
  // A plugin is code every worker runs: found beside the job file, never through the loader's
  // search path or the workers' current directory.
  const auto base = std::filesystem::absolute(path, ec).parent_path();
  for (auto& plugin : job.plugins) {
    if (std::filesystem::path(plugin).is_relative()) {
      plugin = (base / plugin).lexically_normal().string();
    }
  }
  return job;
}

}  // namespace kf
