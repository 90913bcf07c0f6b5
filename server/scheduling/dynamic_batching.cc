#include "server/scheduling/dynamic_batching.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/dtype.h"

namespace precompile::server {
namespace {

using artifact::v1::Frame;
using artifact::v1::Parameter;

// Longer waits are a misconfiguration, and keep the arithmetic finite.
constexpr uint64_t kMaxQueueDelayMicros = 60'000'000;

absl::Status ConfigError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.pbtxt: ", what));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const BatchingConfig>> ReadBatchingConfig(
    const inference::ModelConfig& config) {
  const bool dynamic = config.has_dynamic_batching();
  if (config.max_batch_size() < 0) {
    return ConfigError(absl::StrCat("max_batch_size is ", config.max_batch_size(),
                                    ": it is 0 (no batching) or more"));
  }
  if (config.max_batch_size() == 0) {
    if (dynamic) {
      return ConfigError(
          "dynamic_batching needs max_batch_size above 0 (the most rows a batch may have)");
    }
    return nullptr;
  }
  auto batching = std::make_shared<BatchingConfig>();
  batching->max_batch_size = config.max_batch_size();
  batching->dynamic = dynamic;
  batching->full_rows = batching->max_batch_size;
  if (!dynamic) return batching;
  const inference::ModelDynamicBatching& asked = config.dynamic_batching();
  if (asked.priority_levels() != 0 || asked.priority_queue_policy_size() != 0 ||
      asked.has_default_queue_policy()) {
    return ConfigError(
        "dynamic_batching's priority levels and queue policies are not supported: requests "
        "are served in the order they arrive, each within its own deadline "
        "(parameters max_request_seconds)");
  }
  if (asked.max_queue_delay_microseconds() > kMaxQueueDelayMicros) {
    return ConfigError(absl::StrCat("dynamic_batching { max_queue_delay_microseconds } is ",
                                    asked.max_queue_delay_microseconds(), ", past the limit of ",
                                    kMaxQueueDelayMicros, " (a minute)"));
  }
  batching->max_queue_delay =
      absl::Microseconds(static_cast<int64_t>(asked.max_queue_delay_microseconds()));
  int64_t largest = 0;
  for (const int32_t size : asked.preferred_batch_size()) {
    if (size < 1 || size > batching->max_batch_size) {
      return ConfigError(absl::StrCat("dynamic_batching { preferred_batch_size } lists ", size,
                                      ": each is from 1 to max_batch_size (",
                                      batching->max_batch_size, ")"));
    }
    batching->preferred_batch_sizes.push_back(size);
    largest = std::max<int64_t>(largest, size);
  }
  if (largest > 0) batching->full_rows = largest;
  return batching;
}

absl::Status CheckBatchable(const Frame& entry) {
  // The names of the tensor leaves, in the order of a variant's outputs.
  std::vector<const std::string*> outputs;
  for (const auto& leaf : entry.outputs().leaves()) {
    if (leaf.is_tensor()) outputs.push_back(&leaf.name());
  }
  auto output_name = [&outputs](int i) {
    return i < static_cast<int>(outputs.size()) ? absl::StrCat("output '", *outputs[i], "'")
                                                : absl::StrCat("output ", i);
  };
  for (const auto& variant : entry.variants()) {
    auto refuse = [&](absl::string_view why) {
      return absl::FailedPreconditionError(absl::StrCat(
          "max_batch_size in config.pbtxt makes the first dimension of every input and output "
          "a batch of rows, but variant ", variant.id(), " of frame '", entry.name(), "' ",
          why));
    };
    const artifact::v1::DimGuard* batch = nullptr;
    std::string batch_input;
    for (const auto& guard : variant.guards()) {
      if (!guard.has_tensor() || guard.tensor().is_none() ||
          guard.parameter() >= static_cast<uint32_t>(entry.parameters_size())) {
        continue;
      }
      const std::string& name = entry.parameters(static_cast<int>(guard.parameter())).name();
      if (guard.tensor().dims_size() == 0) {
        return refuse(absl::StrCat("takes input '", name, "' as a scalar (no dimensions)"));
      }
      const artifact::v1::DimGuard& first = guard.tensor().dims(0);
      if (batch == nullptr) {
        batch = &first;
        batch_input = name;
        continue;
      }
      const bool same = first.size_case() == batch->size_case() &&
                        (first.has_symbol() ? first.symbol() == batch->symbol() &&
                                                  first.symbol_offset() == batch->symbol_offset()
                                            : first.static_size() == batch->static_size());
      if (!same) {
        return refuse(absl::StrCat("does not require inputs '", batch_input, "' and '", name,
                                   "' to have the same first dimension"));
      }
    }
    for (int i = 0; i < variant.outputs_size(); ++i) {
      const artifact::v1::TensorSpec& spec = variant.outputs(i);
      if (spec.shape_size() == 0) {
        return refuse(absl::StrCat("returns ", output_name(i), " as a scalar (no dimensions)"));
      }
      if (batch == nullptr) continue;
      // An output's rows are the inputs' rows: the same size, or the same
      // symbol (artifacts that record outputs' symbols).
      const bool keeps_rows =
          batch->has_symbol()
              ? batch->symbol_offset() == 0 &&
                    (spec.shape_symbols_size() == 0 ||
                     spec.shape_symbols(0) == static_cast<int32_t>(batch->symbol()))
              : spec.shape(0) == batch->static_size();
      if (!keeps_rows) {
        return refuse(absl::StrCat("returns ", output_name(i), " whose first dimension is not "
                                   "its inputs' rows (", batch_input, ".size(0))"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BatchRows(absl::Span<const NamedValue> args, absl::string_view model,
                                  int64_t max_batch_size) {
  std::optional<int64_t> rows;
  absl::string_view first_name;
  for (const NamedValue& arg : args) {
    const auto* tensor = std::get_if<TensorArg>(&arg.value);
    if (tensor == nullptr) continue;
    if (tensor->shape.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", arg.name, "' has no dimensions, but model '", model,
          "' batches: each input's first dimension is its rows (max_batch_size in its "
          "config.pbtxt)"));
    }
    if (!rows) {
      rows = tensor->shape[0];
      first_name = arg.name;
    } else if (tensor->shape[0] != *rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs '", first_name, "' and '", arg.name, "' of model '", model,
          "' disagree on their rows (the first dimension): ", *rows, " and ",
          tensor->shape[0]));
    }
  }
  if (!rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request sends no tensor, but model '", model, "' batches rows"));
  }
  if (*rows > max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request has ", *rows, " rows (the inputs' first dimension), more than model '",
        model, "' takes at once: max_batch_size ", max_batch_size, " in its config.pbtxt"));
  }
  return *rows;
}

std::string BatchKey(absl::string_view model, int64_t version,
                     absl::Span<const NamedValue> args) {
  std::vector<const NamedValue*> sorted;
  sorted.reserve(args.size());
  for (const NamedValue& arg : args) sorted.push_back(&arg);
  std::sort(sorted.begin(), sorted.end(),
            [](const NamedValue* a, const NamedValue* b) { return a->name < b->name; });
  // Lengths before names and strings, so that no two keys run together.
  std::string key = absl::StrCat(model.size(), ":", model, "/", version);
  for (const NamedValue* arg : sorted) {
    absl::StrAppend(&key, "|", arg->name.size(), ":", arg->name, "=", arg->value.index(), ":");
    std::visit(
        [&key](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, TensorArg>) {
            absl::StrAppend(&key, static_cast<int>(v.dtype), ",", static_cast<int>(v.device));
            for (size_t d = 1; d < v.shape.size(); ++d) absl::StrAppend(&key, ",", v.shape[d]);
          } else if constexpr (std::is_same_v<T, std::string>) {
            absl::StrAppend(&key, v.size(), ":", v);
          } else if constexpr (std::is_same_v<T, double>) {
            uint64_t bits;
            std::memcpy(&bits, &v, sizeof bits);
            absl::StrAppend(&key, bits);
          } else if constexpr (!std::is_same_v<T, NoneArg>) {
            absl::StrAppend(&key, v);
          }
        },
        arg->value);
  }
  return key;
}

MergedArguments MergeRows(absl::Span<const absl::Span<const NamedValue>> requests) {
  MergedArguments merged;
  const absl::Span<const NamedValue> first = requests.front();
  for (const NamedValue& arg : first) {
    const auto* tensor = std::get_if<TensorArg>(&arg.value);
    if (tensor == nullptr) {
      merged.args.push_back(arg);
      continue;
    }
    // The same argument of every request, found by name: requests may list
    // their inputs in any order.
    std::vector<const TensorArg*> parts;
    size_t bytes = 0;
    int64_t rows = 0;
    for (const absl::Span<const NamedValue> request : requests) {
      for (const NamedValue& other : request) {
        if (other.name != arg.name) continue;
        const TensorArg& part = std::get<TensorArg>(other.value);
        parts.push_back(&part);
        bytes += part.nbytes;
        rows += part.shape[0];
      }
    }
    auto storage = std::make_unique<uint8_t[]>(std::max<size_t>(bytes, 1));
    size_t offset = 0;
    for (const TensorArg* part : parts) {
      if (part->nbytes > 0) std::memcpy(storage.get() + offset, part->data, part->nbytes);
      offset += part->nbytes;
    }
    TensorArg stacked = *tensor;
    stacked.shape[0] = rows;
    stacked.data = storage.get();
    stacked.nbytes = bytes;
    merged.args.push_back({arg.name, std::move(stacked)});
    merged.storage.push_back(std::move(storage));
  }
  return merged;
}

std::vector<int64_t> PaddingBatchSizes(const Frame& entry) {
  std::vector<int64_t> sizes;
  for (const auto& variant : entry.variants()) {
    for (const auto& guard : variant.guards()) {
      if (!guard.has_tensor() || guard.tensor().is_none() || guard.tensor().dims_size() == 0) {
        continue;
      }
      // A batchable variant's inputs agree on their first dimension: the
      // first tensor says it.
      const artifact::v1::DimGuard& rows = guard.tensor().dims(0);
      if (rows.size_case() == artifact::v1::DimGuard::kStaticSize) {
        sizes.push_back(rows.static_size());
      } else if (rows.size_case() == artifact::v1::DimGuard::kSymbol) {
        int64_t low = 0;
        for (const auto& range : variant.symbols()) {
          if (range.symbol() == rows.symbol()) low = range.min();
        }
        sizes.push_back(std::max<int64_t>(1, low + rows.symbol_offset()));
      }
      break;
    }
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

std::vector<int64_t> PaddingTargets(const Frame& entry, int64_t rows, int64_t max_batch_size) {
  std::vector<int64_t> targets;
  for (const int64_t size : PaddingBatchSizes(entry)) {
    if (size > rows && size <= max_batch_size && size <= 2 * rows) targets.push_back(size);
  }
  return targets;
}

uint64_t StackedBytes(absl::Span<const absl::Span<const NamedValue>> requests) {
  uint64_t bytes = 0;
  for (const absl::Span<const NamedValue> request : requests) {
    for (const NamedValue& arg : request) {
      if (const auto* tensor = std::get_if<TensorArg>(&arg.value)) bytes += tensor->nbytes;
    }
  }
  return bytes;
}

std::vector<NamedValue> FirstRow(absl::Span<const NamedValue> request) {
  std::vector<NamedValue> first_row(request.begin(), request.end());
  for (NamedValue& arg : first_row) {
    if (auto* tensor = std::get_if<TensorArg>(&arg.value)) {
      tensor->nbytes /= static_cast<size_t>(tensor->shape[0]);
      tensor->shape[0] = 1;
    }
  }
  return first_row;
}

std::optional<std::vector<std::vector<OutputTensor>>> SplitRows(
    const std::vector<OutputTensor>& outputs, absl::Span<const int64_t> rows) {
  int64_t total = 0;
  for (const int64_t r : rows) total += r;
  for (const OutputTensor& out : outputs) {
    if (out.shape.empty() || out.shape[0] != total) return std::nullopt;
  }
  std::vector<std::vector<OutputTensor>> split(rows.size());
  for (const OutputTensor& out : outputs) {
    const size_t row_bytes = total > 0 ? out.nbytes / static_cast<size_t>(total) : 0;
    int64_t start = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      OutputTensor part = out;
      part.shape[0] = rows[r];
      part.data = static_cast<const uint8_t*>(out.data) + static_cast<size_t>(start) * row_bytes;
      part.nbytes = static_cast<size_t>(rows[r]) * row_bytes;
      split[r].push_back(std::move(part));
      start += rows[r];
    }
  }
  return split;
}

}  // namespace precompile::server
