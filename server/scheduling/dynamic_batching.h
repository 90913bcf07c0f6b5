// Dynamic batching as Triton's users ask for it in a model's config.pbtxt
// (`max_batch_size: N` and `dynamic_batching { ... }`): what the config
// says, whether the model's artifact can honour it, and how the requests of
// one batch become one call and its outputs their answers. No torch, no
// threads: the scheduler (server/scheduling/request_scheduler.h) decides when a batch
// runs, the inference API (server/api/inference_api.h) runs it.
//
// A batching model's tensors all lead with a dimension of independent rows,
// the batch: a request of b rows sends inputs of shape [b, ...] with
// 1 <= b <= max_batch_size, and gets outputs of shape [b, ...]. Requests
// whose arguments agree on everything but their rows (BatchKey) may run as
// one call of their rows stacked in order; row i of the call's outputs then
// belongs to the request that sent row i.
#ifndef PRECOMPILE_SERVER_SCHEDULING_DYNAMIC_BATCHING_H_
#define PRECOMPILE_SERVER_SCHEDULING_DYNAMIC_BATCHING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/artifact.pb.h"
#include "proto/model_config.pb.h"
#include "runtime/value.h"

namespace precompile::server {

struct BatchingConfig {
  // The most rows a request, or a merged call, may have (> 0).
  int64_t max_batch_size = 0;
  // dynamic_batching { } is set: requests are merged. Otherwise each
  // request runs alone, its rows still limited to max_batch_size.
  bool dynamic = false;
  // How long a batch waits for more requests after its first joined.
  absl::Duration max_queue_delay;
  // As the config lists them, in order. A batch that reaches one runs at
  // once if no other request waits to join it.
  std::vector<int64_t> preferred_batch_sizes;
  // A batch runs as soon as it has this many rows: the largest preferred
  // size, or max_batch_size when none is given.
  int64_t full_rows = 0;
};

// The batching that a model's config asks for: null when it asks for none
// (max_batch_size 0 and no dynamic_batching). INVALID_ARGUMENT, prefixed
// "config.pbtxt: ", for settings that contradict each other or that this
// server does not honour (priority levels, queue policies).
absl::StatusOr<std::shared_ptr<const BatchingConfig>> ReadBatchingConfig(
    const inference::ModelConfig& config);

// Whether the artifact's entry frame can be served as a batching model:
// every tensor input and output of every variant has a first dimension,
// and a variant's inputs and outputs agree on it (the same symbol, or the
// same size).
// FAILED_PRECONDITION naming the variant and tensor that cannot.
absl::Status CheckBatchable(const artifact::v1::Frame& entry);

// The rows of a request to a batching model: the first dimension that all
// its tensor arguments share. INVALID_ARGUMENT when a tensor has no first
// dimension, the tensors disagree, or the rows are more than
// `max_batch_size` (the message names `model` and the config's limit).
absl::StatusOr<int64_t> BatchRows(absl::Span<const NamedValue> args, absl::string_view model,
                                  int64_t max_batch_size);

// Requests of one model version with equal keys may be merged: the same
// argument names, tensors of the same dtype, device and sizes past the
// first, equal non-tensor arguments.
std::string BatchKey(absl::string_view model, int64_t version,
                     absl::Span<const NamedValue> args);

// The arguments of one call whose tensors are the requests' tensors stacked
// along their first dimension, in the order given; the non-tensor arguments
// are the first request's. REQUIRES: the requests' BatchKeys are equal.
struct MergedArguments {
  std::vector<NamedValue> args;
  // The stacked bytes, which `args` point into.
  std::vector<std::unique_ptr<uint8_t[]>> storage;
};
MergedArguments MergeRows(absl::Span<const absl::Span<const NamedValue>> requests);

// The batch sizes a call whose rows no variant of `entry` takes may be
// padded up to, ascending: each static batch size a variant takes, and the
// smallest batch of each variant whose batch is a symbol (the low end of
// its range, plus the dimension's offset; Dynamo's dynamic sizes start at
// 2, so a request of one row is padded to two). REQUIRES:
// CheckBatchable(entry) is OK.
std::vector<int64_t> PaddingBatchSizes(const artifact::v1::Frame& entry);

// The sizes a call of `rows` rows may be padded up to, ascending: those of
// PaddingBatchSizes(entry) above `rows`, at most `max_batch_size`, and at
// most twice `rows`: the padded call is a copy of the rows and their
// padding, so a request's bytes are copied twice at most (one row of a
// 256 MiB request padded to 16 would be copied 16 times).
std::vector<int64_t> PaddingTargets(const artifact::v1::Frame& entry, int64_t rows,
                                    int64_t max_batch_size);

// The bytes MergeRows(requests) copies the tensors into.
uint64_t StackedBytes(absl::Span<const absl::Span<const NamedValue>> requests);

// `request`'s first row: each tensor a view of its first row (the
// request's bytes, not a copy), the other arguments as they are. Stacked
// after the requests k times, it pads a merged call by k rows (a real row,
// so that values the model indexes with stay in range), and its rows of
// the outputs are dropped. REQUIRES: `request`'s tensors have at least one
// row; the view lives no longer than `request`'s bytes.
std::vector<NamedValue> FirstRow(absl::Span<const NamedValue> request);

// Each request's share of a merged call's outputs: for request r, every
// output's rows from the sum of rows[0..r) on, sharing the output's bytes.
// nullopt when an output's first dimension is not the sum of `rows` (the
// call did not keep rows apart, and its outputs cannot be split).
std::optional<std::vector<std::vector<OutputTensor>>> SplitRows(
    const std::vector<OutputTensor>& outputs, absl::Span<const int64_t> rows);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SCHEDULING_DYNAMIC_BATCHING_H_
