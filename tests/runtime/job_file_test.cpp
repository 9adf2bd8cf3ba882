// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/job_file.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kf {
namespace {

// A file with every key; the comments are the line numbers the tests below rely on.
const std::string kFullFile =
    "job:\n"                                              // 1
    "  name: fashion-mnist\n"                             // 2
    "workers:\n"                                          // 3
    "  min: 1\n"                                          // 4
    "  max: 8\n"                                          // 5
    "  initial: 2\n"                                      // 6
    "algorithm: ring\n"                                   // 7
    "batch_size: 64\n"                                    // 8
    "learning_rate: 0.1\n"                                // 9
    "timeouts:\n"                                         // 10
    "  collective_ms: 4000\n"                             // 11
    "  heartbeat_ms: 0\n"                                 // 12
    "  connect_ms: 15000\n"                               // 13
    "ports: 20000-20100\n"                                // 14
    "commit_every: 5\n"                                   // 15
    "checkpoint: {path: ckpt.bin, every: 10}\n"           // 16
    "metrics: {port: 9100, jsonl: metrics.jsonl}\n"       // 17
    "policies:\n"                                         // 18
    "  - name: gns-batch-size\n"                          // 19
    "    params: {min_batch: 32, max_batch: 4096}\n"      // 20
    "  - name: my-policy\n"                               // 21
    "plugins: [libmy_policy.so, /opt/kf/libother.so]\n";  // 22

/// The JobFileError that parsing `yaml` (named "job.yaml") throws; fails the test if none.
JobFileError error_of(const std::string& yaml) {
  try {
    parse_job_file(yaml, "job.yaml");
  } catch (const JobFileError& e) {
    return e;
  }
  ADD_FAILURE() << "no JobFileError for:\n" << yaml;
  return JobFileError("", 0, "", "none");
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid())))
      .string();
}

TEST(JobFile, FullFileReadsEveryKey) {
  const JobFile j = parse_job_file(kFullFile, "full.yaml");
  EXPECT_EQ(j.source, "full.yaml");
  EXPECT_EQ(j.name, "fashion-mnist");
  EXPECT_EQ(j.workers.min, 1);
  EXPECT_EQ(j.workers.max, 8);
  EXPECT_EQ(j.workers.initial, 2);
  EXPECT_EQ(j.algorithm, Algorithm::ring);
  EXPECT_EQ(j.batch_size, 64);
  EXPECT_DOUBLE_EQ(j.learning_rate, 0.1);
  EXPECT_EQ(j.timeouts.collective, std::chrono::milliseconds(4000));
  EXPECT_EQ(j.timeouts.heartbeat, std::chrono::milliseconds(0));
  EXPECT_EQ(j.timeouts.connect, std::chrono::milliseconds(15000));
  EXPECT_EQ(j.ports.first, 20000);
  EXPECT_EQ(j.ports.last, 20100);
  EXPECT_EQ(j.commit_every, 5);
  ASSERT_TRUE(j.checkpoint);
  EXPECT_EQ(j.checkpoint->path, "ckpt.bin");
  EXPECT_EQ(j.checkpoint->every, 10);
  ASSERT_TRUE(j.metrics);
  EXPECT_EQ(j.metrics->port, 9100);
  EXPECT_EQ(j.metrics->jsonl, "metrics.jsonl");
  ASSERT_EQ(j.policies.size(), 2u);
  EXPECT_EQ(j.policies[0].name, "gns-batch-size");
  EXPECT_EQ(j.policies[0].params, (nlohmann::json{{"min_batch", 32}, {"max_batch", 4096}}));
  EXPECT_EQ(j.policies[0].line, 19);
  EXPECT_EQ(j.policies[1].name, "my-policy");
  EXPECT_EQ(j.policies[1].params, nlohmann::json::object());
  EXPECT_EQ(j.policies[1].line, 21);
  EXPECT_EQ(j.plugins, (std::vector<std::string>{"libmy_policy.so", "/opt/kf/libother.so"}));
}

TEST(JobFile, TextThatIsNotUtf8IsRefusedNamingTheLine) {
  // A byte that is no UTF-8 (found by the fuzz harness: it used to escape as a JSON error
  // while the message quoting the value was made).
  EXPECT_EQ(std::string(error_of("job: {name: a}\nalgorithm: r\xb8ng\n").what()),
            "job.yaml:2: not UTF-8 text without control characters (byte 28)");
  EXPECT_EQ(error_of("job: {name: \xc0\xaf}\n").line(), 1);               // overlong '/'
  EXPECT_EQ(error_of("job: {name: \xed\xa0\x80}\n").line(), 1);           // a surrogate
  EXPECT_EQ(error_of("job: {name: \xf4\x90\x80\x80}\n").line(), 1);       // past U+10FFFF
  EXPECT_EQ(error_of("job: {name: ab\xe2\x82}").line(), 1);               // cut short at the end
  EXPECT_EQ(error_of(std::string("job: {name: a\0b}\n", 17)).line(), 1);  // NUL
  EXPECT_EQ(error_of("job:\n  name: a\x04\n").line(), 2);                 // a control character
  // A long value cut for the message in the middle of a character still makes a message.
  // 56 bytes, then a 2-byte character the cut at 57 bytes splits.
  const std::string long_value = std::string(56, 'a') + "\xc3\xbc" + "bbbb";
  const std::string message = error_of("job: {name: n}\nbatch_size: " + long_value + "\n").what();
  EXPECT_NE(message.find("batch_size"), std::string::npos) << message;
  // Well-formed multi-byte text is fine: 2, 3 and 4 bytes.
  const std::string name =
      "gr\xc3\xbc\xc3\x9f"
      "e \xe2\x82\xac \xf0\x9f\x98\x80";
  EXPECT_EQ(parse_job_file("job: {name: \"" + name + "\"}\n", "x").name, name);
}

TEST(JobFile, LoadReadsTheFileAndNamesItInErrors) {
  const std::string path = temp_path("kf-job-file-test.yaml");
  {
    std::ofstream out(path);
    out << kFullFile;
  }
  const JobFile j = load_job_file(path);
  EXPECT_EQ(j.source, path);
  EXPECT_EQ(j.name, "fashion-mnist");
  EXPECT_EQ(j.policies.size(), 2u);
  EXPECT_EQ(j.to_settings(), parse_job_file(kFullFile, "x").to_settings());
  // A relative plugin is taken beside the job file, never through the loader's search path.
  const auto dir = std::filesystem::absolute(path).parent_path();
  EXPECT_EQ(j.plugins,
            (std::vector<std::string>{(dir / "libmy_policy.so").string(), "/opt/kf/libother.so"}));
  {
    std::ofstream out(path);
    out << "job: {}\nbatch_size: 0\n";
  }
  try {
    load_job_file(path);
    ADD_FAILURE() << "batch_size 0 was accepted";
  } catch (const JobFileError& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ":2: batch_size: must be an integer in 1..1048576, got 0");
  }
  std::filesystem::remove(path);
  try {
    load_job_file(path);
    ADD_FAILURE() << "a missing file was read";
  } catch (const JobFileError& e) {
    EXPECT_EQ(e.line(), 0);
    EXPECT_EQ(std::string(e.what()).rfind(path + ": cannot open the job file: ", 0), 0u)
        << e.what();
  }
}

TEST(JobFile, DefaultsFillEveryKeyLeftOut) {
  const JobFile j = parse_job_file("job: {}\n", "j");
  EXPECT_EQ(j.name, "kf");
  EXPECT_EQ(j.workers.min, 1);
  EXPECT_EQ(j.workers.max, 64);
  EXPECT_EQ(j.workers.initial, 1);
  EXPECT_EQ(j.algorithm, Algorithm::auto_select);
  EXPECT_EQ(j.batch_size, 32);
  EXPECT_DOUBLE_EQ(j.learning_rate, 0.01);
  EXPECT_EQ(j.timeouts.collective, std::chrono::milliseconds(3000));
  EXPECT_EQ(j.timeouts.heartbeat, std::chrono::milliseconds(750));
  EXPECT_EQ(j.timeouts.connect, std::chrono::milliseconds(20000));
  EXPECT_EQ(j.ports.first, 10000);
  EXPECT_EQ(j.ports.last, 32767);
  EXPECT_EQ(j.commit_every, 1);
  EXPECT_FALSE(j.checkpoint);
  EXPECT_FALSE(j.metrics);
  EXPECT_TRUE(j.policies.empty());
  EXPECT_TRUE(j.plugins.empty());

  // initial follows min; a section's other keys keep their defaults.
  const JobFile k = parse_job_file(
      "job: {}\nworkers: {min: 3}\ncheckpoint: {path: c.bin}\nmetrics: {jsonl: m.jsonl}\n"
      "timeouts: {heartbeat_ms: 100}\n",
      "k");
  EXPECT_EQ(k.workers.min, 3);
  EXPECT_EQ(k.workers.max, 64);
  EXPECT_EQ(k.workers.initial, 3);
  ASSERT_TRUE(k.checkpoint);
  EXPECT_EQ(k.checkpoint->every, 100);
  ASSERT_TRUE(k.metrics);
  EXPECT_EQ(k.metrics->port, 0);
  EXPECT_EQ(k.timeouts.heartbeat, std::chrono::milliseconds(100));
  EXPECT_EQ(k.timeouts.collective, std::chrono::milliseconds(3000));
}

TEST(JobFile, NumbersFollowTheYaml12CoreSchema) {
  EXPECT_DOUBLE_EQ(parse_job_file("job: {}\nlearning_rate: 1\n", "j").learning_rate, 1.0);
  EXPECT_DOUBLE_EQ(parse_job_file("job: {}\nlearning_rate: 1e-3\n", "j").learning_rate, 1e-3);
  EXPECT_DOUBLE_EQ(parse_job_file("job: {}\nlearning_rate: .5\n", "j").learning_rate, 0.5);
  EXPECT_DOUBLE_EQ(parse_job_file("job: {}\nlearning_rate: 2.\n", "j").learning_rate, 2.0);
  EXPECT_DOUBLE_EQ(parse_job_file("job: {}\nlearning_rate: +1.5E+1\n", "j").learning_rate, 15.0);
  EXPECT_EQ(parse_job_file("job: {}\nbatch_size: 0x40\n", "j").batch_size, 64);
  EXPECT_EQ(parse_job_file("job: {}\nbatch_size: +128\n", "j").batch_size, 128);
  EXPECT_EQ(parse_job_file("job: {}\nbatch_size: !!int 256\n", "j").batch_size, 256);
  EXPECT_EQ(parse_job_file("job: {name: !!str 2024}\n", "j").name, "2024");
  EXPECT_EQ(parse_job_file("job: {name: 'kf'}\nalgorithm: \"rhd\"\n", "j").algorithm,
            Algorithm::rhd);
}

TEST(JobFile, ParamsKeepTheirYamlTypesAsJson) {
  const JobFile j = parse_job_file(
      "job: {}\n"
      "policies:\n"
      "  - name: p\n"
      "    params:\n"
      "      int: 42\n"
      "      negative: -7\n"
      "      hex: 0x1F\n"
      "      octal: 0o17\n"
      "      big: 18446744073709551615\n"
      "      float: 0.5\n"
      "      exp: 1e-3\n"
      "      whole_float: 2.0\n"
      "      yes_bool: true\n"
      "      no_bool: False\n"
      "      text: hello world\n"
      "      quoted_number: \"64\"\n"
      "      tagged: !!str 12\n"
      "      yaml11_yes: yes\n"
      "      underscored: 1_000\n"
      "      quoted_null: \"null\"\n"
      "      single_quoted_bool: 'true'\n"
      "      nothing: ~\n"
      "      empty:\n"
      "      list: [1, two, 3.5, [true]]\n"
      "      nested: {a: {b: [x, {c: 1}]}}\n"
      "      block: |\n"
      "        line\n",
      "j");
  ASSERT_EQ(j.policies.size(), 1u);
  const nlohmann::json& p = j.policies[0].params;
  EXPECT_TRUE(p.at("int").is_number_integer());
  EXPECT_EQ(p.at("int"), 42);
  EXPECT_EQ(p.at("negative").get<std::int64_t>(), -7);
  EXPECT_EQ(p.at("hex"), 31);
  EXPECT_EQ(p.at("octal"), 15);
  EXPECT_TRUE(p.at("big").is_number_unsigned());
  EXPECT_EQ(p.at("big").get<std::uint64_t>(), 18446744073709551615u);
  EXPECT_TRUE(p.at("float").is_number_float());
  EXPECT_DOUBLE_EQ(p.at("float").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(p.at("exp").get<double>(), 1e-3);
  EXPECT_TRUE(p.at("whole_float").is_number_float());
  EXPECT_EQ(p.at("yes_bool"), true);
  EXPECT_EQ(p.at("no_bool"), false);
  EXPECT_EQ(p.at("text"), "hello world");
  EXPECT_EQ(p.at("quoted_number"), "64");
  EXPECT_EQ(p.at("tagged"), "12");
  EXPECT_EQ(p.at("yaml11_yes"), "yes");
  EXPECT_EQ(p.at("underscored"), "1_000");
  EXPECT_EQ(p.at("quoted_null"), "null");
  EXPECT_EQ(p.at("single_quoted_bool"), "true");
  EXPECT_TRUE(p.at("nothing").is_null());
  EXPECT_TRUE(p.at("empty").is_null());
  EXPECT_EQ(p.at("list"), nlohmann::json::parse(R"([1, "two", 3.5, [true]])"));
  EXPECT_TRUE(p.at("list")[0].is_number_integer());
  EXPECT_EQ(p.at("nested"), nlohmann::json::parse(R"({"a": {"b": ["x", {"c": 1}]}})"));
  EXPECT_EQ(p.at("block"), "line\n");
  EXPECT_EQ(p.size(), 22u);
}

TEST(JobFile, ToSettingsGivesTheClusterSettings) {
  const JobFile j = parse_job_file(kFullFile, "j");
  EXPECT_EQ(j.to_settings(), nlohmann::json::parse(R"({"algorithm": "ring", "batch_size": 64,
      "lr": 0.1, "min_workers": 1, "max_workers": 8})"));
  const nlohmann::json d = parse_job_file("job: {}\n", "d").to_settings();
  EXPECT_EQ(d.at("algorithm"), "auto");
  EXPECT_TRUE(d.at("batch_size").is_number_integer());
  EXPECT_TRUE(d.at("lr").is_number_float());
  EXPECT_EQ(d.at("max_workers"), 64);
}

TEST(JobFile, ModeAndCompressionBecomeSettingsInCanonicalForm) {
  const JobFile j =
      parse_job_file("job: {}\nmode: \"sma:period=1\"\ncompression: topk:0.010\n", "j");
  ASSERT_TRUE(j.mode);
  EXPECT_EQ(j.mode->mode, TrainingMode::sma);
  EXPECT_EQ(j.to_settings().at("mode"), "sma");
  EXPECT_EQ(j.to_settings().at("compression"), "topk:0.01");
  EXPECT_FALSE(parse_job_file("job: {}\n", "d").to_settings().contains("mode"));
  EXPECT_EQ(std::string(error_of("job: {}\nmode: sma:period=0\n").what()),
            "job.yaml:2: mode: mode 'sma:period=0': period must be an integer from 1 to "
            "1000000, not '0'");
  EXPECT_EQ(std::string(error_of("job: {}\ncompression: 5\n").what())
                .rfind("job.yaml:2: "
                       "compression: ",
                       0),
            0u);
  EXPECT_EQ(std::string(error_of("job: {}\ncompression: topk\n").what()),
            "job.yaml:2: compression: compression 'topk': topk needs a ratio in (0, 1] after "
            "':', e.g. topk:0.01");
}

TEST(JobFile, UnknownKeyIsNamedWithItsLineAndTheKnownKeys) {
  const JobFileError e = error_of("job: {}\nworkers:\n  min: 1\n  maximum: 8\n");
  EXPECT_EQ(std::string(e.what()),
            "job.yaml:4: workers.maximum: unknown key (expected one of: min, max, initial)");
  EXPECT_EQ(e.source(), "job.yaml");
  EXPECT_EQ(e.line(), 4);
  EXPECT_EQ(e.key(), "workers.maximum");

  EXPECT_EQ(
      std::string(error_of("job: {}\nbatch: 64\n").what())
          .rfind("job.yaml:2: batch: unknown key (expected one of: job, workers, algorithm,", 0),
      0u);
  EXPECT_EQ(
      std::string(error_of("job: {}\npolicies:\n  - name: a\n  - name: b\n    parms: {}\n").what()),
      "job.yaml:5: policies[1].parms: unknown key (expected one of: name, params)");
}

TEST(JobFile, WrongTypeSaysWhatWasExpectedAndWhatWasGiven) {
  EXPECT_EQ(std::string(error_of("job: {}\nbatch_size: \"64\"\n").what()),
            "job.yaml:2: batch_size: must be an integer in 1..1048576, got \"64\"");
  EXPECT_EQ(std::string(error_of("job: {}\nbatch_size: 64.0\n").what()),
            "job.yaml:2: batch_size: must be an integer in 1..1048576, got 64.0");
  EXPECT_EQ(std::string(error_of("job: {}\nlearning_rate: fast\n").what()),
            "job.yaml:2: learning_rate: must be a finite number > 0, got \"fast\"");
  EXPECT_EQ(std::string(error_of("job: {}\nworkers: [1, 8]\n").what()),
            "job.yaml:2: workers: must be a mapping, got a sequence");
  EXPECT_EQ(std::string(error_of("job:\nworkers: {}\n").what()),
            "job.yaml:1: job: must be a mapping, got null");
  EXPECT_EQ(std::string(error_of("job: {name: 7}\n").what()),
            "job.yaml:1: job.name: must be a non-empty string, got 7");
  EXPECT_EQ(std::string(error_of("job: {}\nplugins: [a.so, true]\n").what()),
            "job.yaml:2: plugins[1]: must be a shared-library path (a non-empty string), got true");
  EXPECT_EQ(std::string(error_of("job: {}\npolicies:\n  - name: p\n    params: [1]\n").what()),
            "job.yaml:4: policies[0].params: must be a mapping of parameters, got a sequence");
  EXPECT_EQ(std::string(error_of("job: {}\nalgorithm: allgather\n").what()),
            "job.yaml:2: algorithm: must be one of auto, star, ring, tree, clique, rhd, "
            "hierarchical, got "
            "\"allgather\"");
  EXPECT_EQ(std::string(error_of("- job\n").what()),
            "job.yaml:1: must be a mapping of the job file's keys (job, workers, algorithm, ...), "
            "got a sequence");
}

TEST(JobFile, OutOfRangeValueNamesTheBound) {
  const JobFileError e =
      error_of(kFullFile.substr(0, kFullFile.find("workers:")) + "workers:\n  min: 2\n  max: 1\n");
  EXPECT_EQ(std::string(e.what()),
            "job.yaml:5: workers.max: must be an integer >= workers.min (2), got 1");
  EXPECT_EQ(e.line(), 5);
  EXPECT_EQ(e.key(), "workers.max");

  const auto what = [](const std::string& yaml) { return std::string(error_of(yaml).what()); };
  EXPECT_EQ(what("job: {}\nworkers: {min: 0}\n"),
            "job.yaml:2: workers.min: must be an integer >= 1, got 0");
  EXPECT_EQ(what("job: {}\nworkers: {min: 100}\n"),
            "job.yaml:2: workers.min: must be an integer <= workers.max (64 by default), got 100");
  EXPECT_EQ(what("job: {}\nworkers: {min: 2, max: 4, initial: 5}\n"),
            "job.yaml:2: workers.initial: must be an integer in workers.min..workers.max (2..4), "
            "got 5");
  EXPECT_EQ(what("job: {}\nworkers: {max: 3000000000}\n"),
            "job.yaml:2: workers.max: must be an integer >= workers.min (1) and <= 2147483647, got "
            "3000000000");
  EXPECT_EQ(what("job: {}\ncommit_every: 99999999999999999999\n"),
            "job.yaml:2: commit_every: must be an integer >= 1 and <= 9223372036854775807, got "
            "99999999999999999999");
  EXPECT_EQ(what("job: {}\nbatch_size: 1048577\n"),
            "job.yaml:2: batch_size: must be an integer in 1..1048576, got 1048577");
  EXPECT_EQ(what("job: {}\nlearning_rate: 0\n"),
            "job.yaml:2: learning_rate: must be a finite number > 0, got 0");
  EXPECT_EQ(what("job: {}\nlearning_rate: .inf\n"),
            "job.yaml:2: learning_rate: must be a finite number > 0, got .inf");
  EXPECT_EQ(what("job: {}\ntimeouts:\n  heartbeat_ms: 600001\n"),
            "job.yaml:3: timeouts.heartbeat_ms: must be an integer in 0..600000 (0 disables "
            "heartbeats), got 600001");
  EXPECT_EQ(what("job: {}\ntimeouts:\n  collective_ms: 0\n"),
            "job.yaml:3: timeouts.collective_ms: must be an integer in 1..3600000, got 0");
  for (const auto& [ports, shown] : {std::pair{"0-10", "\"0-10\""},
                                     {"200-100", "\"200-100\""},
                                     {"1-65536", "\"1-65536\""},
                                     {"80", "80"},
                                     {"a-b", "\"a-b\""},
                                     {"1-2-3", "\"1-2-3\""}}) {
    EXPECT_EQ(what(std::string("job: {}\nports: ") + ports + "\n"),
              std::string("job.yaml:2: ports: must be a port range \"A-B\" with 1 <= A <= B <= "
                          "65535, got ") +
                  shown);
  }
  EXPECT_EQ(what("job: {}\nmetrics: {port: 70000}\n"),
            "job.yaml:2: metrics.port: must be an integer in 0..65535 (0 = no metrics endpoint), "
            "got 70000");
  EXPECT_EQ(what("job: {}\npolicies:\n  - name: p\n    params: {x: .nan}\n"),
            "job.yaml:4: policies[0].params.x: must be a finite number (JSON holds no infinity "
            "or NaN), got .nan");
}

TEST(JobFile, DuplicateKeyNamesBothLines) {
  const JobFileError e = error_of("job: {}\nbatch_size: 64\nalgorithm: ring\nbatch_size: 128\n");
  EXPECT_EQ(std::string(e.what()),
            "job.yaml:4: batch_size: duplicate key (first on line 2); a key may appear once");
  EXPECT_EQ(e.line(), 4);
  EXPECT_EQ(std::string(error_of("job: {}\npolicies:\n  - name: p\n    params:\n      a: 1\n"
                                 "      b: {c: 1, c: 2}\n")
                            .what()),
            "job.yaml:6: policies[0].params.b.c: duplicate key (first on line 6); a key may "
            "appear once");
}

TEST(JobFile, MissingRequiredKeyNamesItsPath) {
  EXPECT_EQ(std::string(error_of("workers: {min: 1}\n").what()),
            "job.yaml:1: job: missing required key (expected a mapping such as `job: {name: "
            "my-job}`)");
  EXPECT_EQ(std::string(error_of("# nothing yet\n").what()),
            "job.yaml:1: job: missing required key (expected a mapping such as `job: {name: "
            "my-job}`)");
  const JobFileError e = error_of("job: {}\npolicies:\n  - name: a\n  - params: {x: 1}\n");
  EXPECT_EQ(std::string(e.what()),
            "job.yaml:4: policies[1].name: missing required key (expected the policy's name, a "
            "non-empty string)");
  EXPECT_EQ(e.key(), "policies[1].name");
  EXPECT_EQ(std::string(error_of("job: {}\ncheckpoint:\n  every: 10\n").what()),
            "job.yaml:2: checkpoint.path: missing required key (expected the checkpoint file's "
            "path, a non-empty string)");
}

TEST(JobFile, MalformedYamlGivesTheParsersLine) {
  const JobFileError e = error_of("job: {}\nplugins: [a.so\nbatch_size: 2\n");
  EXPECT_EQ(e.line(), 3);
  EXPECT_EQ(e.key(), "");
  EXPECT_EQ(std::string(e.what()).rfind("job.yaml:3: malformed YAML: ", 0), 0u) << e.what();
  EXPECT_NE(std::string(e.what()).find("(column "), std::string::npos) << e.what();

  // A stray directive after content (found by the fuzz harness): yaml-cpp's LoadAll returned
  // empty documents from it until memory ran out; now it is one malformed document.
  const JobFileError stray = error_of(
      ",job: {name: j, workers: 2}\ntraining: {batch_size: 64, lr: 0.01}\npolicies:\n"
      "%  - name: plateau\n    every: 10\n");
  EXPECT_GE(stray.line(), 1) << stray.what();

  EXPECT_EQ(std::string(error_of("job: {}\n---\njob: {}\n").what()),
            "job.yaml:2: a job file holds one YAML document, found more (remove the extra '---')");
}

TEST(JobFile, UnsupportedYamlFeaturesAreRejectedNotMisread) {
  EXPECT_EQ(std::string(error_of("job: {}\nbatch_size: !!int many\n").what()),
            "job.yaml:2: batch_size: is tagged !!int but \"many\" is not one");
  EXPECT_EQ(std::string(error_of("job: {}\nbatch_size: !custom 4\n").what()),
            "job.yaml:2: batch_size: has the tag !custom; only the core schema's !!str, !!int, "
            "!!float, !!bool and !!null are understood");
  EXPECT_EQ(std::string(error_of("job: {}\nbase: &b {x: 1}\n").what())
                .rfind("job.yaml:2: base: unknown key", 0),
            0u);
  EXPECT_EQ(
      std::string(
          error_of("job: {}\npolicies:\n  - name: p\n    params:\n      <<: {x: 1}\n").what()),
      "job.yaml:5: policies[0].params.<<: merge keys (<<) are not supported; write the "
      "keys out");
  // An alias is an ordinary value.
  const JobFile j = parse_job_file(
      "job: {}\npolicies:\n  - name: p\n    params: &p {x: 1}\n  - name: q\n    params: *p\n", "j");
  EXPECT_EQ(j.policies[1].params, j.policies[0].params);
}

TEST(JobFile, AutoscaleGoesIntoTheSettingsAndABadOneNamesItsLine) {
  const JobFile j = parse_job_file(
      "job: {}\nworkers: {max: 8}\nautoscale: {min: 2, max: 6, target: all, cooldown_s: 5}\n",
      "job.yaml");
  ASSERT_TRUE(j.autoscale);
  EXPECT_EQ(j.to_settings()["autoscale"],
            (nlohmann::json{{"min", 2}, {"max", 6}, {"target", "all"}, {"cooldown_s", 5.0}}));
  EXPECT_FALSE(parse_job_file("job: {}\n", "job.yaml").to_settings().contains("autoscale"));
  const auto e = error_of("job: {}\nautoscale:\n  min: 3\n  max: 2\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "autoscale");
  EXPECT_NE(std::string(e.what()).find("min 3 is greater than max 2"), std::string::npos)
      << e.what();
  EXPECT_NE(std::string(error_of("job: {}\nautoscale: {cooldown_s: -2}\n").what())
                .find("cooldown_s: expected a number"),
            std::string::npos);
  EXPECT_NE(std::string(error_of("job: {}\nworkers: {max: 4}\nautoscale: {max: 6}\n").what())
                .find("max 6 is greater than workers.max 4"),
            std::string::npos);
  EXPECT_NE(std::string(error_of("job: {}\nautoscale: all\n").what()).find("a mapping"),
            std::string::npos);
}

TEST(JobFile, SparesGoIntoTheSettings) {
  EXPECT_EQ(parse_job_file("job: {}\nspares: 2\n", "job.yaml").to_settings()["spares"], 2);
  EXPECT_FALSE(parse_job_file("job: {}\nspares: 0\n", "job.yaml").to_settings().contains("spares"));
  const auto e = error_of("job: {}\nspares: -1\n");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.key(), "spares");
}

// Aliases repeat what they name: nine levels of aliases of ten make 10^9 values from a dozen
// lines. The conversion of policy parameters is bounded, and says so, instead of running out of
// memory; so is their depth.
TEST(JobFile, AliasesThatExpandWithoutEndAreRefused) {
  // The policies' parameters are converted as a whole: the bomb goes there.
  std::string yaml =
      "job: {}\npolicies:\n  - name: p\n    params:\n      defs: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, "
      "10]\n";
  for (int i = 1; i <= 9; ++i) {
    const std::string p = "*a" + std::to_string(i - 1);
    yaml += "      l" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + p + ", " + p +
            ", " + p + ", " + p + ", " + p + ", " + p + ", " + p + ", " + p + ", " + p + ", " + p +
            "]\n";
  }
  const auto e = error_of(yaml);
  EXPECT_NE(std::string(e.what()).find("expands to more than 100000 values"), std::string::npos)
      << e.what();
  std::string deep = "job: {}\npolicies:\n  - name: p\n    params: {x: ";
  for (int i = 0; i < 80; ++i) deep += "[";
  for (int i = 0; i < 80; ++i) deep += "]";
  deep += "}\n";
  EXPECT_NE(std::string(error_of(deep).what()).find("nested deeper than 64 levels"),
            std::string::npos);
  // Aliases within the bound are fine.
  EXPECT_NO_THROW(parse_job_file(
      "job: {}\npolicies:\n  - name: p\n    params: {a: &x [1, 2], b: *x}\n", "ok.yaml"));
}

}  // namespace
}  // namespace kf
