// What the server reads of a model's optional <model>/config.pbtxt,
// Triton's ModelConfig in text format: the version policy, the model's own
// request time limit, its batching and its sequences' state. No files but
// that one, no torch.
#ifndef PRECOMPILE_SERVER_REPOSITORY_MODEL_CONFIG_FILE_H_
#define PRECOMPILE_SERVER_REPOSITORY_MODEL_CONFIG_FILE_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/repository/model_state.h"
#include "server/repository/repository_policy.h"
#include "server/scheduling/dynamic_batching.h"
#include "server/scheduling/sequence_state.h"

namespace precompile::server {

struct ModelConfigFile {
  VersionPolicy policy;
  // parameters { key: "max_request_seconds" ... }: seconds, or "0" for no
  // limit (InfiniteDuration); nullopt when not set (the server's applies).
  std::optional<absl::Duration> max_request_time;
  // max_batch_size and dynamic_batching; null for none.
  std::shared_ptr<const BatchingConfig> batching;
  // sequence_batching's state; null for none.
  std::shared_ptr<const SequenceConfig> sequences;
  // instance_group; count 0 when it has none.
  InstanceGroups instances;
};

// `text` as model `name`'s config. Fields this server does not know are
// ignored, as long as they are written without list brackets (protobuf's
// parser cannot skip `f [ {...} ]` of an unknown field). It may name the
// model, as its directory does. INVALID_ARGUMENT, starting "config.pbtxt",
// naming what it refuses: text that does not parse, another model's name,
// a version policy or limit out of range, batching or sequence settings that
// contradict each other, instance groups this server cannot place (on named
// GPUs, of kinds that differ, more than kMaxInstances in all).
inline constexpr int kMaxInstances = 64;
absl::StatusOr<ModelConfigFile> ParseModelConfig(absl::string_view name, const std::string& text);

// The config of model `name` in `model_dir`: the defaults when it has no
// config.pbtxt; ParseModelConfig's errors, or INVALID_ARGUMENT when it
// cannot be read.
absl::StatusOr<ModelConfigFile> ReadModelConfig(absl::string_view name,
                                                const std::string& model_dir);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_MODEL_CONFIG_FILE_H_
