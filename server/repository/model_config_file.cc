#include "server/repository/model_config_file.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "proto/model_config.pb.h"

namespace precompile::server {
namespace {

namespace fs = std::filesystem;

class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first.empty()) first = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  std::string first;
};

// The parameter max_request_seconds: seconds (a decimal number) or "0" for
// no limit.
absl::StatusOr<std::optional<absl::Duration>> ReadMaxRequestTime(
    const inference::ModelConfig& config) {
  auto it = config.parameters().find("max_request_seconds");
  if (it == config.parameters().end()) return std::nullopt;
  const std::string& text = it->second.string_value();
  double seconds = 0;
  // Past a million seconds is as good as none, and keeps the arithmetic finite.
  if (!absl::SimpleAtod(text, &seconds) || !(seconds >= 0) || seconds > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.pbtxt: parameters max_request_seconds is '", text,
        "', not a number of seconds from 0 (no limit) to 1000000"));
  }
  if (seconds == 0) return absl::InfiniteDuration();
  return absl::Seconds(seconds);
}

// instance_group: each group's count (Triton's default 1) summed. Instances
// run where the server runs its models (--device), so a group may ask for a
// kind of device but not for particular GPUs.
absl::StatusOr<InstanceGroups> ReadInstanceGroups(const inference::ModelConfig& config) {
  InstanceGroups groups;
  for (const inference::ModelInstanceGroup& group : config.instance_group()) {
    const std::string named =
        group.name().empty() ? std::string("instance_group") :
                               absl::StrCat("instance_group '", group.name(), "'");
    if (group.count() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.pbtxt: ", named, " has count ", group.count(), ": at least 1"));
    }
    if (!group.gpus().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.pbtxt: ", named, " names gpus, but a model's instances all run on the "
          "server's device (--device=cuda:N); leave gpus out"));
    }
    InstanceGroups::Kind kind = InstanceGroups::Kind::kAny;
    if (group.kind() == inference::ModelInstanceGroup::KIND_CPU) kind = InstanceGroups::Kind::kCpu;
    if (group.kind() == inference::ModelInstanceGroup::KIND_GPU) kind = InstanceGroups::Kind::kGpu;
    if (kind != InstanceGroups::Kind::kAny) {
      if (groups.kind != InstanceGroups::Kind::kAny && groups.kind != kind) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.pbtxt: ", named, " asks for ",
            inference::ModelInstanceGroup::Kind_Name(group.kind()),
            " where another group asks for the other kind: a model runs on one device"));
      }
      groups.kind = kind;
    }
    const int count = group.count() == 0 ? 1 : group.count();
    if (count > kMaxInstances - groups.count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.pbtxt: instance_group asks for more than ", kMaxInstances,
          " instances of each variant"));
    }
    groups.count += count;
  }
  return groups;
}

}  // namespace

absl::StatusOr<ModelConfigFile> ParseModelConfig(absl::string_view name, const std::string& text) {
  inference::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowUnknownField(true);
  FirstError error;
  parser.RecordErrorsTo(&error);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(absl::StrCat("config.pbtxt:", error.first));
  }
  if (!config.name().empty() && config.name() != name) {
    return absl::InvalidArgumentError(absl::StrCat("config.pbtxt names the model '", config.name(),
                                                   "', its directory '", name, "'"));
  }
  VersionPolicy policy;
  const inference::ModelVersionPolicy& asked = config.version_policy();
  switch (asked.policy_choice_case()) {
    case inference::ModelVersionPolicy::kLatest:
      if (asked.latest().num_versions() < 1) {
        return absl::InvalidArgumentError(
            "config.pbtxt: version_policy { latest { num_versions } } must be at least 1");
      }
      policy.latest = asked.latest().num_versions();
      break;
    case inference::ModelVersionPolicy::kAll:
      policy.kind = VersionPolicy::Kind::kAll;
      break;
    case inference::ModelVersionPolicy::kSpecific:
      policy.kind = VersionPolicy::Kind::kSpecific;
      for (const int64_t version : asked.specific().versions()) {
        if (version < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "config.pbtxt: version_policy { specific } names version ", version,
              ": versions are positive integers"));
        }
        policy.specific.push_back(version);
      }
      if (policy.specific.empty()) {
        return absl::InvalidArgumentError(
            "config.pbtxt: version_policy { specific } names no version");
      }
      break;
    case inference::ModelVersionPolicy::POLICY_CHOICE_NOT_SET:
      break;
  }
  absl::StatusOr<std::optional<absl::Duration>> max_request_time = ReadMaxRequestTime(config);
  if (!max_request_time.ok()) return max_request_time.status();
  absl::StatusOr<std::shared_ptr<const BatchingConfig>> batching = ReadBatchingConfig(config);
  if (!batching.ok()) return batching.status();
  absl::StatusOr<std::shared_ptr<const SequenceConfig>> sequences = ReadSequenceConfig(config);
  if (!sequences.ok()) return sequences.status();
  absl::StatusOr<InstanceGroups> instances = ReadInstanceGroups(config);
  if (!instances.ok()) return instances.status();
  return ModelConfigFile{std::move(policy), *max_request_time, *std::move(batching),
                         *std::move(sequences), *instances};
}

absl::StatusOr<ModelConfigFile> ReadModelConfig(absl::string_view name,
                                                const std::string& model_dir) {
  const fs::path path = fs::path(model_dir) / "config.pbtxt";
  std::error_code ec;
  if (!fs::exists(path, ec)) return ModelConfigFile{};
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot be read"));
  return ParseModelConfig(name, text.str());
}

}  // namespace precompile::server
