#include "server/api/inference_api.h"

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "base/status_macros.h"
#include "runtime/dtype.h"
#include "runtime/inference_memory.h"
#include "server/api/tensor_codec.h"
#include "server/scheduling/dynamic_batching.h"

namespace precompile::server {
namespace {

using artifact::v1::Frame;
using artifact::v1::Parameter;

constexpr char kServerName[] = "precompile-serve";
constexpr char kServerVersion[] = "0.1.0";
constexpr char kPlatform[] = "precompile_serve";

// What a log line quotes of what a client sent: a model name or a message
// that quotes a shape can be as long as the request.
constexpr size_t kMaxLoggedName = 128;
constexpr size_t kMaxLoggedMessage = 1024;

// A failed call of a stateful model whose message names a state input names
// what the client never sent: says what that input is. The state's first
// name the message holds is the one explained.
absl::Status NamingTheState(const absl::Status& failed, const SequenceStore::State& state) {
  for (const auto& [input, tensor] : state) {
    if (absl::StrContains(failed.message(), input)) {
      return absl::Status(
          failed.code(),
          absl::StrCat(failed.message(), " ('", input,
                       "' is the state the server keeps for this sequence, as its earlier requests "
                       "left it: this request does not fit it)"));
    }
  }
  return failed;
}

// Request parameters that Triton's clients may send and that mean nothing
// here; they are accepted and ignored rather than refused.
const absl::flat_hash_set<std::string>& IgnoredParameters() {
  static const auto* keys = new absl::flat_hash_set<std::string>{
      "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
      "binary_data_output", "triton_enable_empty_final_response", "headers"};
  return *keys;
}

// SHA-256 of a client's certificate (PEM) in hex; empty for none.
std::string CertificateFingerprint(absl::string_view pem) {
  if (pem.empty()) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(pem.data(), pem.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    // Never shared with clients that present none.
    return std::string(pem);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

bool IsTensorKind(Parameter::Kind kind) {
  return kind == Parameter::TENSOR || kind == Parameter::OPTIONAL_TENSOR;
}

struct TensorMeta {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  // An input the request may leave out (its argument has a default).
  bool optional = false;
};

// Merges the sizes the variants guard for one tensor: a dimension every
// variant fixes to the same size keeps it, anything else is -1.
void MergeShape(std::optional<std::vector<int64_t>>& merged,
                const std::vector<int64_t>& shape) {
  if (!merged) {
    merged = shape;
    return;
  }
  if (merged->size() != shape.size()) {
    merged = std::vector<int64_t>{-1};
    return;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if ((*merged)[d] != shape[d]) (*merged)[d] = -1;
  }
}

// The tensor arguments the example calls passed: a tensor argument no call
// passed keeps its default (None) in every variant, so it is not listed,
// although a request that sends it is answered (refused by the guards).
std::vector<TensorMeta> InputsOf(const Frame& frame) {
  std::vector<TensorMeta> inputs;
  for (int p = 0; p < frame.parameters_size(); ++p) {
    const Parameter& param = frame.parameters(p);
    if (!IsTensorKind(param.kind())) continue;
    if (!param.passed() && param.has_default_value()) continue;
    TensorMeta meta;
    meta.name = param.name();
    meta.optional = param.has_default_value();
    meta.dtype = DTypeFromProto(param.example_dtype()).value_or(DType::kFloat32);
    std::optional<std::vector<int64_t>> shape;
    for (const auto& variant : frame.variants()) {
      for (const auto& guard : variant.guards()) {
        if (guard.parameter() != static_cast<uint32_t>(p) || !guard.has_tensor() ||
            guard.tensor().is_none()) {
          continue;
        }
        std::vector<int64_t> dims;
        for (const auto& dim : guard.tensor().dims()) {
          dims.push_back(dim.has_symbol() ? -1 : dim.static_size());
        }
        MergeShape(shape, dims);
      }
    }
    meta.shape = shape.value_or(std::vector<int64_t>{-1});
    inputs.push_back(std::move(meta));
  }
  return inputs;
}

// The tensor leaves of what the frame returns; the others are not sent.
std::vector<TensorMeta> OutputsOf(const Frame& frame) {
  std::vector<TensorMeta> outputs;
  for (const auto& leaf : frame.outputs().leaves()) {
    if (leaf.is_tensor()) outputs.push_back({leaf.name()});
  }
  std::vector<std::optional<std::vector<int64_t>>> shapes(outputs.size());
  for (const auto& variant : frame.variants()) {
    for (int i = 0; i < variant.outputs_size() && i < static_cast<int>(outputs.size());
         ++i) {
      const auto& spec = variant.outputs(i);
      outputs[i].dtype = DTypeFromProto(spec.dtype()).value_or(DType::kFloat32);
      MergeShape(shapes[i], std::vector<int64_t>(spec.shape().begin(), spec.shape().end()));
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].shape = shapes[i].value_or(std::vector<int64_t>{-1});
  }
  return outputs;
}

absl::StatusOr<Value> ParameterValue(const std::string& name,
                                     const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return Value(p.bool_param());
    case inference::InferParameter::kInt64Param: return Value(p.int64_param());
    case inference::InferParameter::kDoubleParam: return Value(p.double_param());
    case inference::InferParameter::kStringParam: return Value(p.string_param());
    case inference::InferParameter::kUint64Param:
      if (p.uint64_param() > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter '", name, "' is too large for an int"));
      }
      return Value(static_cast<int64_t>(p.uint64_param()));
    default:
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has no value"));
  }
}

// A recorded default as Python would print it: 0, 2.5, True, 'mean', None.
std::string ScalarText(const artifact::v1::Scalar& s) {
  switch (s.value_case()) {
    case artifact::v1::Scalar::kBoolValue: return s.bool_value() ? "True" : "False";
    case artifact::v1::Scalar::kIntValue: return absl::StrCat(s.int_value());
    case artifact::v1::Scalar::kFloatValue: return absl::StrCat(s.float_value());
    case artifact::v1::Scalar::kStringValue: return absl::StrCat("'", s.string_value(), "'");
    default: return "None";
  }
}

RequestOutcome OutcomeOfStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted: return RequestOutcome::kRefused;
    case absl::StatusCode::kInvalidArgument: return RequestOutcome::kInvalid;
    case absl::StatusCode::kResourceExhausted: return RequestOutcome::kOverloaded;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded: return RequestOutcome::kCancelled;
    default: return RequestOutcome::kError;
  }
}


// The state tensors of a model that keeps sequences are the server's, not
// the client's: `meta` without them.
std::vector<TensorMeta> WithoutState(std::vector<TensorMeta> meta, const SequenceConfig* sequences,
                                     bool inputs) {
  if (sequences == nullptr) return meta;
  std::erase_if(meta, [&](const TensorMeta& t) {
    return (inputs ? sequences->ForInput(t.name) : sequences->ForOutput(t.name)) != nullptr;
  });
  return meta;
}

// Triton's sequence parameters of a request to a model that keeps
// sequences.
struct SequenceParams {
  SequenceId id;
  bool start = false;
  bool end = false;
};

absl::StatusOr<SequenceParams> ReadSequenceParams(const inference::ModelInferRequest& request) {
  const auto& params = request.parameters();
  auto id = params.find("sequence_id");
  if (id == params.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", request.model_name(),
        "' keeps state between the requests of a sequence (sequence_batching in its "
        "config.pbtxt): a request names its sequence with the parameter sequence_id (a "
        "positive integer or a string), and a sequence's first request carries "
        "sequence_start"));
  }
  SequenceParams sequence;
  const inference::InferParameter& value = id->second;
  const auto not_an_id = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter 'sequence_id' is ", what, ": a positive integer or a string of 1 to ",
        kMaxSequenceIdBytes, " bytes"));
  };
  switch (value.parameter_choice_case()) {
    case inference::InferParameter::kInt64Param:
      if (value.int64_param() <= 0) return not_an_id(absl::StrCat(value.int64_param()));
      sequence.id.text = absl::StrCat(value.int64_param());
      break;
    case inference::InferParameter::kUint64Param:
      if (value.uint64_param() == 0) return not_an_id("0");
      sequence.id.text = absl::StrCat(value.uint64_param());
      break;
    case inference::InferParameter::kStringParam:
      if (value.string_param().empty() || value.string_param().size() > kMaxSequenceIdBytes) {
        return not_an_id(absl::StrCat("a string of ", value.string_param().size(), " bytes"));
      }
      sequence.id.text = absl::StrCat("\"", absl::CHexEscape(value.string_param()), "\"");
      break;
    default:
      return not_an_id("neither an integer nor a string");
  }
  for (const auto& [key, flag] : {std::pair<const char*, bool*>{"sequence_start", &sequence.start},
                                  std::pair<const char*, bool*>{"sequence_end", &sequence.end}}) {
    auto it = params.find(key);
    if (it == params.end()) continue;
    if (it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", key, "' is a bool (true or false)"));
    }
    *flag = it->second.bool_param();
  }
  return sequence;
}

// `parts` stacked into one call's arguments, their bytes charged to what
// model calls hold (--max_inference_memory_bytes) for as long as they live.
struct Stacked {
  ChargedBytes charge;
  MergedArguments merged;
};
absl::StatusOr<Stacked> Stack(absl::Span<const absl::Span<const NamedValue>> parts,
                              absl::string_view what) {
  ASSIGN_OR_RETURN(ChargedBytes charge, ChargedBytes::Charge(StackedBytes(parts), what));
  return Stacked{std::move(charge), MergeRows(parts)};
}

// Whether `args` (`rows` rows) with their first row repeated up to a
// batch size some variant takes (PaddingTargets) match a variant: one row,
// say, where Dynamo's dynamic batch starts at two. RESOURCE_EXHAUSTED when
// the padded copy does not fit in what model calls may hold.
absl::StatusOr<bool> PaddedRowsMatch(LoadedVersion& model, absl::string_view name,
                                     absl::Span<const NamedValue> args, int64_t rows,
                                     int64_t max_rows) {
  if (rows < 1) return false;
  LoadedVersion::CallContext match_only;
  match_only.match_only = true;
  const std::vector<NamedValue> first_row = FirstRow(args);
  for (const int64_t size : PaddingTargets(model.entry_frame(), rows, max_rows)) {
    std::vector<absl::Span<const NamedValue>> parts = {args};
    parts.insert(parts.end(), static_cast<size_t>(size - rows), first_row);
    ASSIGN_OR_RETURN(const Stacked padded,
                     Stack(parts, absl::StrCat("model '", name, "': padding a request's rows from ",
                                               rows, " to ", size)));
    absl::StatusOr<CallResult> match = model.Call(padded.merged.args, match_only);
    if (match.ok() && !match->no_variant) return true;
  }
  return false;
}

}  // namespace

bool InferenceApi::ModelReady(const std::string& name, const std::string& version) const {
  return !state_.draining() && repository_.Get(name, version).ok();
}

void InferenceApi::ServerMetadata(inference::ServerMetadataResponse* response) const {
  response->set_name(kServerName);
  response->set_version(kServerVersion);
  // binary_tensor_data is the HTTP/REST endpoint's (server/http/http_codec.h).
  for (const char* e : {"model_repository", "model_configuration", "statistics",
                        "parameters", "binary_tensor_data"}) {
    response->add_extensions(e);
  }
}

absl::Status InferenceApi::ModelMetadata(const inference::ModelMetadataRequest& request,
                                         inference::ModelMetadataResponse* response) const {
  auto handle = repository_.Get(request.name(), request.version());
  if (!handle.ok()) return handle.status();
  const Frame& entry = handle->model->entry_frame();
  response->set_name(request.name());
  // Every version served, as Triton lists them; the inputs and outputs are
  // those of the version asked for (the newest when none is).
  auto versions = repository_.GetVersions(request.name());
  if (versions.ok()) {
    for (const ModelRepository::Handle& v : *versions) response->add_versions(absl::StrCat(v.version));
  } else {
    response->add_versions(absl::StrCat(handle->version));
  }
  response->set_platform(kPlatform);
  // A batching model's first dimension is its rows, of any number up to
  // max_batch_size: -1, as Triton says.
  const bool batching = handle->batching != nullptr;
  const SequenceConfig* sequences = handle->sequences.get();
  for (const TensorMeta& in : WithoutState(InputsOf(entry), sequences, true)) {
    auto* t = response->add_inputs();
    t->set_name(in.name);
    t->set_datatype(DatatypeOf(in.dtype));
    for (int64_t d : in.shape) t->add_shape(d);
    if (batching && t->shape_size() > 0) t->set_shape(0, -1);
  }
  for (const TensorMeta& out : WithoutState(OutputsOf(entry), sequences, false)) {
    auto* t = response->add_outputs();
    t->set_name(out.name);
    t->set_datatype(DatatypeOf(out.dtype));
    for (int64_t d : out.shape) t->add_shape(d);
    if (batching && t->shape_size() > 0) t->set_shape(0, -1);
  }
  return absl::OkStatus();
}

absl::Status InferenceApi::ModelConfig(const inference::ModelConfigRequest& request,
                                       inference::ModelConfigResponse* response) const {
  auto handle = repository_.Get(request.name(), request.version());
  if (!handle.ok()) return handle.status();
  const auto& manifest = handle->model->manifest();
  const Frame& entry = handle->model->entry_frame();
  inference::ModelConfig* config = response->mutable_config();
  config->set_name(request.name());
  config->set_platform(kPlatform);
  config->set_backend("precompile");
  // A batching model's dims leave out the batch, as Triton's do; a model
  // without batching takes whole tensors (max_batch_size 0).
  const BatchingConfig* batching = handle->batching.get();
  const size_t skipped = batching != nullptr ? 1 : 0;
  config->set_max_batch_size(batching != nullptr ? static_cast<int32_t>(batching->max_batch_size)
                                                 : 0);
  if (batching != nullptr && batching->dynamic) {
    inference::ModelDynamicBatching* dynamic = config->mutable_dynamic_batching();
    for (const int64_t size : batching->preferred_batch_sizes) {
      dynamic->add_preferred_batch_size(static_cast<int32_t>(size));
    }
    dynamic->set_max_queue_delay_microseconds(
        static_cast<uint64_t>(absl::ToInt64Microseconds(batching->max_queue_delay)));
  }
  VersionPolicy policy;
  for (const ModelState& state : repository_.List()) {
    if (state.name == request.name()) policy = state.policy;
  }
  inference::ModelVersionPolicy* version_policy = config->mutable_version_policy();
  switch (policy.kind) {
    case VersionPolicy::Kind::kLatest:
      version_policy->mutable_latest()->set_num_versions(static_cast<uint32_t>(policy.latest));
      break;
    case VersionPolicy::Kind::kAll:
      version_policy->mutable_all();
      break;
    case VersionPolicy::Kind::kSpecific:
      for (const int64_t v : policy.specific) version_policy->mutable_specific()->add_versions(v);
      break;
  }
  const std::vector<TensorMeta> inputs = InputsOf(entry);
  const SequenceConfig* sequences = handle->sequences.get();
  if (sequences != nullptr) {
    inference::ModelSequenceBatching* asked = config->mutable_sequence_batching();
    asked->set_max_sequence_idle_microseconds(
        static_cast<uint64_t>(absl::ToInt64Microseconds(sequences->max_idle)));
    for (const SequenceConfig::State& state : sequences->states) {
      auto* s = asked->add_state();
      s->set_input_name(state.input);
      s->set_output_name(state.output);
      for (const TensorMeta& in : inputs) {
        if (in.name != state.input) continue;
        s->set_data_type(ConfigDataTypeOf(in.dtype));
        for (int64_t d : in.shape) s->add_dims(d);
      }
    }
  }
  for (const TensorMeta& in : WithoutState(inputs, sequences, true)) {
    auto* t = config->add_input();
    t->set_name(in.name);
    t->set_data_type(ConfigDataTypeOf(in.dtype));
    for (size_t d = skipped; d < in.shape.size(); ++d) t->add_dims(in.shape[d]);
    t->set_optional(in.optional);
  }
  for (const TensorMeta& out : WithoutState(OutputsOf(entry), sequences, false)) {
    auto* t = config->add_output();
    t->set_name(out.name);
    t->set_data_type(ConfigDataTypeOf(out.dtype));
    for (size_t d = skipped; d < out.shape.size(); ++d) t->add_dims(out.shape[d]);
  }
  auto* group = config->add_instance_group();
  group->set_name(request.name());
  group->set_count(handle->model->runners_per_variant());
  group->set_kind(manifest.device() == "cuda" ? inference::ModelInstanceGroup::KIND_GPU
                                              : inference::ModelInstanceGroup::KIND_CPU);
  auto& params = *config->mutable_parameters();
  for (const Parameter& p : entry.parameters()) {
    if (IsTensorKind(p.kind())) continue;
    std::string kind = absl::AsciiStrToLower(Parameter::Kind_Name(p.kind()));
    params[absl::StrCat("argument:", p.name())].set_string_value(
        p.has_default_value() ? absl::StrCat(kind, ", default ", ScalarText(p.default_value()))
                              : kind);
  }
  params["entry_frame"].set_string_value(entry.name());
  params["complete"].set_string_value(manifest.summary().complete() ? "true" : "false");
  params["eager_fallbacks"].set_string_value(
      absl::StrJoin(manifest.summary().eager_fallbacks(), ","));
  params["torch_version"].set_string_value(manifest.torch_version());
  return absl::OkStatus();
}


// One request between its stages: what Decode made of it, and what it
// has done so far. Tensor arguments point into `request` and `storage`, so
// it lives on the heap and never moves.
struct InferenceApi::RequestState {
  explicit RequestState(absl::Time received) : received(received) {}

  const absl::Time received;
  RequestOutcome outcome = RequestOutcome::kError;
  ModelRepository::Handle handle;
  RequestTiming timing;
  inference::ModelInferRequest request;
  // Where the request was when something threw, for its answer.
  const char* stage = "decoding the request";
  // The request's limit, and when it passes (InfiniteFuture: never).
  absl::Duration limit;
  absl::Time deadline = absl::InfiniteFuture();
  // The entry's arguments, and the bytes of inputs that needed a copy.
  std::vector<NamedValue> args;
  std::vector<std::string> storage;
  // The names of the entry's tensor outputs, in the order of the call's
  // outputs, and which of them the request wants.
  absl::InlinedVector<const std::string*, 8> output_names;
  std::vector<bool> wanted;
  // Since when the model's time counts (RequestTiming::infer): decoded,
  // or resumed after the wait for an eager thread or a batch.
  absl::Time model_start;
  // The inferences it counts for: its rows for a batching model, else 1.
  int64_t rows = 1;
  // No variant takes its rows as they are, but one takes them padded: it
  // runs as a merged call even alone.
  bool only_padded = false;
  // It ran as part of a merged call, whose execution is recorded once, and
  // the rows of padding that call had.
  bool shared_execution = false;
  int64_t batch_padding_rows = 0;
  // A request of a sequence: its hold on the sequence, the state it passes
  // to the model (which `args` point into), and whether it ends the
  // sequence.
  std::optional<SequenceStore::Lease> sequence;
  SequenceStore::State sequence_state;
  bool sequence_end = false;
  // Which outputs are the sequence's state (by output index): on CUDA they
  // stay in device memory for its next request.
  std::vector<bool> state_outputs;
  // Its trace id when it is traced (else 0), its timestamps so far and
  // its model's frame calls.
  uint64_t trace_id = 0;
  std::vector<std::pair<const char*, absl::Time>> trace_points;
  std::vector<FrameCallEvent> frame_calls;

  void Mark(const char* name, absl::Time t) {
    if (trace_id != 0) trace_points.emplace_back(name, t);
  }
};

InferenceApi::Call::Call() = default;
InferenceApi::Call::~Call() = default;

std::optional<absl::Status> InferenceApi::Infer(Call& call, absl::Time received) {
  auto state = std::make_unique<RequestState>(received);
  RequestState& s = *state;
  bool deferred = false;
  bool batch = false;
  absl::Status status = Guarded(s, [&] {
    absl::Status decoded = Decode(call, s);
    if (!decoded.ok()) return decoded;
    absl::StatusOr<bool> joins = JoinsBatch(s, call.ticket_);
    if (!joins.ok()) return joins.status();
    if (*joins) {
      batch = true;
      return absl::OkStatus();
    }
    return RunModel(call, s, &deferred);
  });
  if ((deferred || batch) && status.ok()) {
    call.pending_ = std::move(state);
    call.waits_for_batch_ = batch;
    return std::nullopt;
  }
  return Finish(s, std::move(status));
}

absl::StatusOr<bool> InferenceApi::JoinsBatch(RequestState& s, BatchTicket& ticket) {
  const BatchingConfig* batching = s.handle.batching.get();
  if (batching == nullptr) return false;
  absl::StatusOr<int64_t> rows =
      BatchRows(s.args, s.request.model_name(), batching->max_batch_size);
  if (!rows.ok()) return rows.status();
  s.rows = *rows;
  if (!batching->dynamic || *rows >= batching->full_rows) return false;
  // A request whose deadline comes before a batch's delay could pass does
  // not wait for others.
  const bool urgent = s.deadline - absl::Now() <= 2 * batching->max_queue_delay;
  // Only a request that a variant serves, alone or with its rows padded,
  // waits for others: merged, it is served by a variant or runs alone after
  // all. One that a variant serves alone and cannot wait runs alone now;
  // one only padded rows serve runs padded now.
  LoadedVersion::CallContext match_only;
  match_only.match_only = true;
  s.stage = "matching the request to a variant";
  absl::StatusOr<CallResult> match = s.handle.model->Call(s.args, match_only);
  if (!match.ok()) return false;
  if (!match->no_variant && urgent) return false;
  if (match->no_variant) {
    ASSIGN_OR_RETURN(const bool padded, PaddedRowsMatch(*s.handle.model, s.request.model_name(),
                                                        s.args, *rows, batching->max_batch_size));
    if (!padded) return false;
  }
  s.only_padded = match->no_variant;
  // The loaded copy too: a version reloaded meanwhile is another model.
  ticket.key = absl::StrCat(BatchKey(s.request.model_name(), s.handle.version, s.args), "@",
                            reinterpret_cast<uintptr_t>(s.handle.model.get()));
  ticket.rows = *rows;
  ticket.max_rows = batching->max_batch_size;
  ticket.full_rows = batching->full_rows;
  ticket.preferred_rows = batching->preferred_batch_sizes;
  ticket.max_delay = urgent ? absl::ZeroDuration() : batching->max_queue_delay;
  ticket.deadline = s.deadline;
  s.model_start = absl::Now();
  s.Mark("BATCH_QUEUE_START", s.model_start);
  return true;
}

std::vector<std::optional<absl::Status>> InferenceApi::InferBatch(
    absl::Span<Call* const> calls) {
  std::vector<std::optional<absl::Status>> answers(calls.size());
  std::vector<std::unique_ptr<RequestState>> states(calls.size());
  std::vector<size_t> live;
  const absl::Time resumed = absl::Now();
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& call = *calls[i];
    states[i] = std::move(call.pending_);
    call.waits_for_batch_ = false;
    if (states[i] == nullptr) {
      answers[i] = absl::InternalError(
          "a request ran in a batch it never joined (an internal error)");
      continue;
    }
    RequestState& s = *states[i];
    // The wait for the batch is queueing, as the wait for a run slot is.
    s.timing.queue += resumed - s.model_start;
    s.model_start = resumed;
    s.Mark("BATCH_START", resumed);
    if (absl::Status wanted = StillWanted(call, s, resumed, "while it waited for its batch",
                                          "it waited for its batch that long");
        !wanted.ok()) {
      answers[i] = Finish(s, std::move(wanted));
    } else {
      live.push_back(i);
    }
  }
  const bool merge = live.size() >= 2 || (live.size() == 1 && states[live.front()]->only_padded);
  absl::Status unstacked;
  if (merge && RunMerged(calls, states, live, answers, unstacked)) return answers;
  for (const size_t i : live) {
    RequestState& s = *states[i];
    // Alone it would only be refused as a miss: the memory was what failed.
    if (s.only_padded && !unstacked.ok()) {
      answers[i] = Finish(s, unstacked);
      continue;
    }
    bool deferred = false;
    absl::Status status = Guarded(s, [&] { return RunModel(*calls[i], s, &deferred); });
    if (deferred && status.ok()) {
      calls[i]->pending_ = std::move(states[i]);
      continue;
    }
    answers[i] = Finish(s, std::move(status));
  }
  return answers;
}

bool InferenceApi::RunMerged(absl::Span<Call* const> calls,
                             std::vector<std::unique_ptr<RequestState>>& states,
                             const std::vector<size_t>& live,
                             std::vector<std::optional<absl::Status>>& answers,
                             absl::Status& unstacked) {
  RequestState& first = *states[live.front()];
  std::optional<CallResult> merged;
  std::vector<int64_t> rows;
  int64_t total_rows = 0;
  // Rows of padding the call that served them had.
  int64_t padding_rows = 0;
  std::vector<FrameCallEvent> merged_frames;
  first.stage = "running a merged batch";
  const absl::Status tried = Guarded(first, [&] {
    std::vector<absl::Span<const NamedValue>> parts;
    const std::vector<NamedValue>* with_rows = nullptr;
    for (const size_t i : live) {
      parts.push_back(states[i]->args);
      rows.push_back(states[i]->rows);
      total_rows += states[i]->rows;
      if (with_rows == nullptr && states[i]->rows > 0) with_rows = &states[i]->args;
    }
    // A merged call that no variant takes, or that fails, is no answer:
    // each request then runs alone and gets the answer it gets alone.
    LoadedVersion::CallContext variant_only;
    variant_only.variant_only = true;
    variant_only.frame_calls = &merged_frames;
    // Stacked inputs that do not fit beside what calls hold are no answer
    // either: alone, each request is charged only its own.
    const auto served = [&](absl::Span<const absl::Span<const NamedValue>> all) {
      merged_frames.clear();
      const absl::StatusOr<Stacked> args =
          Stack(all, absl::StrCat("model '", first.request.model_name(), "': merging ", live.size(),
                                  " requests"));
      if (!args.ok()) {
        unstacked = args.status();
        return false;
      }
      absl::StatusOr<CallResult> result = first.handle.model->Call(args->merged.args, variant_only);
      if (result.ok() && !result->no_variant) merged = *std::move(result);
      return merged.has_value();
    };
    if (served(parts) || with_rows == nullptr) return absl::OkStatus();
    const std::vector<NamedValue> first_row = FirstRow(*with_rows);
    // No variant takes these rows: padded up to a batch size a variant
    // takes, the smallest first.
    for (const int64_t size : PaddingTargets(first.handle.model->entry_frame(), total_rows,
                                             first.handle.batching->max_batch_size)) {
      parts.resize(live.size());
      parts.insert(parts.end(), static_cast<size_t>(size - total_rows), first_row);
      if (served(parts)) {
        padding_rows = size - total_rows;
        break;
      }
    }
    return absl::OkStatus();
  });
  if (!tried.ok() || !merged) return false;
  std::vector<int64_t> split_rows = rows;
  if (padding_rows > 0) split_rows.push_back(padding_rows);
  std::optional<std::vector<std::vector<OutputTensor>>> split =
      SplitRows(merged->outputs, split_rows);
  if (!split) return false;
  const absl::Time called = absl::Now();
  if (first.handle.metrics) first.handle.metrics->RecordExecution(total_rows);
  for (size_t k = 0; k < live.size(); ++k) {
    RequestState& s = *states[live[k]];
    s.timing.infer += called - s.model_start;
    s.shared_execution = true;
    s.batch_padding_rows = padding_rows;
    if (s.trace_id != 0) s.frame_calls = merged_frames;
    s.Mark("COMPUTE_OUTPUT_START", called);
    CallResult mine;
    mine.outcome = merged->outcome;
    mine.variant_id = merged->variant_id;
    mine.outputs = std::move((*split)[k]);
    absl::Status status =
        Guarded(s, [&] { return Answer(*calls[live[k]], s, std::move(mine), called, total_rows); });
    answers[live[k]] = Finish(s, std::move(status));
  }
  return true;
}

absl::Status InferenceApi::InferEager(Call& call) {
  std::unique_ptr<RequestState> state = std::move(call.pending_);
  if (state == nullptr) {
    return absl::InternalError("an eager miss resumed that never stopped (an internal error)");
  }
  RequestState& s = *state;
  // The wait for an eager thread is queueing, as the wait for a run slot is.
  const absl::Time resumed = absl::Now();
  s.timing.queue += resumed - s.model_start;
  s.model_start = resumed;
  s.Mark("EAGER_START", resumed);
  absl::Status status = Guarded(s, [&] { return RunModel(call, s, nullptr); });
  return Finish(s, std::move(status));
}

absl::Status InferenceApi::Guarded(RequestState& s, absl::FunctionRef<absl::Status()> stages) {
  try {
    return stages();
  } catch (...) {
    const CaughtException caught = DescribeCaughtException();
    if (caught.out_of_memory) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server ran out of memory while ", s.stage));
    }
    // The exception's text is for the log, not for the client.
    spdlog::error("event=request_threw stage=\"{}\" what=\"{}\"", s.stage, caught.what);
    return absl::InternalError(absl::StrCat("the server failed while ", s.stage,
                                            " (an internal error; the server's log has it)"));
  }
}

absl::Status InferenceApi::Finish(RequestState& s, absl::Status status) {
  const absl::Time done = absl::Now();
  if (!status.ok()) {
    s.outcome = OutcomeOfStatus(status);
    LogFailure(s.request.model_name(), s.handle.model != nullptr, status);
  }
  if (s.handle.metrics) {
    s.timing.total = done - s.received;
    s.timing.inferences = s.rows;
    s.handle.metrics->RecordRequest(s.outcome, s.timing);
    if (status.ok() && !s.shared_execution) s.handle.metrics->RecordExecution(s.rows);
  }
  if (s.trace_id != 0) {
    s.Mark("REQUEST_END", done);
    RequestTrace trace;
    trace.id = s.trace_id;
    trace.model = s.request.model_name();
    trace.version = s.handle.version;
    trace.request_id = s.request.id();
    trace.outcome = RequestOutcomeName(s.outcome);
    trace.timestamps = std::move(s.trace_points);
    trace.frame_calls = std::move(s.frame_calls);
    tracer_->Write(trace);
  }
  return status;
}

absl::Status InferenceApi::StillWanted(Call& call, const RequestState& s, absl::Time now,
                                       absl::string_view when, absl::string_view waited) {
  if (call.Cancelled()) {
    return absl::CancelledError(
        absl::StrCat("the client cancelled the request or its deadline passed ", when));
  }
  if (now >= s.deadline) return PastDeadline(s, absl::CancelledError(waited));
  return absl::OkStatus();
}

absl::Status InferenceApi::PastDeadline(const RequestState& s, const absl::Status& status) {
  const bool model_limit = s.handle.max_request_time.has_value();
  return absl::DeadlineExceededError(absl::StrCat(
      "the request ran past ",
      model_limit ? absl::StrCat("model '", s.request.model_name(), "''s limit of ")
                  : std::string("the server's limit of "),
      absl::FormatDuration(s.limit), " per request",
      model_limit ? " (max_request_seconds in its config.pbtxt): " : " (--max_request_seconds): ",
      status.message()));
}

absl::Status InferenceApi::Decode(Call& call, RequestState& s) {
  const absl::Time start = absl::Now();
  s.timing.queue = start - s.received;
  if (absl::Status parsing = call.Parse(&s.request); !parsing.ok()) return parsing;
  const inference::ModelInferRequest& request = s.request;
  auto found = repository_.Get(request.model_name(), request.model_version());
  if (!found.ok()) {
    if (metrics_ && found.status().code() == absl::StatusCode::kNotFound) {
      metrics_->RecordUnknownModelRequest();
    }
    return found.status();
  }
  s.handle = *std::move(found);
  const ModelRepository::Handle* handle = &s.handle;
  if (tracer_ != nullptr) s.trace_id = tracer_->Sample(request.model_name());
  s.Mark("REQUEST_START", s.received);
  s.Mark("QUEUE_START", s.received);
  s.Mark("COMPUTE_START", start);
  // The model's own limit, if its config.pbtxt sets one, else the server's.
  s.limit = handle->max_request_time.value_or(max_request_time_);
  if (s.limit > absl::ZeroDuration() && s.limit < absl::InfiniteDuration()) {
    s.deadline = s.received + s.limit;
  }
  if (absl::Status wanted = StillWanted(call, s, absl::Now(), "before it ran",
                                        "it waited in the queue that long");
      !wanted.ok()) {
    return wanted;
  }
  const Frame& entry = handle->model->entry_frame();
  auto parameter_of = [&](const std::string& name) -> const Parameter* {
    for (const Parameter& p : entry.parameters()) {
      if (p.name() == name) return &p;
    }
    return nullptr;
  };

  // Inputs: the entry's tensor arguments, by name.
  std::vector<NamedValue>& args = s.args;
  s.storage.resize(request.inputs_size());
  // Names given so far, for duplicates: requests name a handful of arguments.
  absl::InlinedVector<absl::string_view, 8> seen;
  const auto first_time = [&seen](absl::string_view name) {
    if (absl::c_linear_search(seen, name)) return false;
    seen.push_back(name);
    return true;
  };
  const SequenceConfig* sequences = handle->sequences.get();
  for (int i = 0; i < request.inputs_size(); ++i) {
    const std::string& name = request.inputs(i).name();
    const Parameter* p = parameter_of(name);
    if (sequences != nullptr && sequences->ForInput(name) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' of model '", request.model_name(),
          "' is its sequences' state (sequence_batching in its config.pbtxt): the server "
          "keeps it between a sequence's requests; send only sequence_id"));
    }
    if (p == nullptr || !IsTensorKind(p->kind())) {
      std::vector<std::string> tensors;
      for (const TensorMeta& in : WithoutState(InputsOf(entry), sequences, true)) {
        tensors.push_back(in.name);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", request.model_name(), "' has no input '", name, "' (its inputs: ",
          absl::StrJoin(tensors, ", "), ")",
          p ? "; non-tensor arguments travel as request parameters" : ""));
    }
    if (!first_time(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", name, "' appears more than once"));
    }
    absl::StatusOr<TensorArg> tensor = DecodeInput(request, i, &s.storage[i]);
    if (!tensor.ok()) return tensor.status();
    args.push_back({name, *std::move(tensor)});
  }
  // Parameters: the entry's non-tensor arguments, by name.
  for (const auto& [key, value] : request.parameters()) {
    const Parameter* p = parameter_of(key);
    if (p == nullptr) {
      if (IgnoredParameters().contains(key)) continue;
      std::vector<absl::string_view> arguments;
      for (const Parameter& q : entry.parameters()) {
        if (!IsTensorKind(q.kind())) arguments.push_back(q.name());
      }
      return UnknownArgumentError(
          request.model_name(), key,
          arguments.empty() ? "none but its inputs" : absl::StrJoin(arguments, ", "));
    }
    if (IsTensorKind(p->kind())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument '", key, "' is a tensor: send it as an input, not a parameter"));
    }
    if (!first_time(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("argument '", key, "' is given more than once"));
    }
    absl::StatusOr<Value> v = ParameterValue(key, value);
    if (!v.ok()) return v.status();
    args.push_back({key, *std::move(v)});
  }
  // Requested outputs must be tensors the entry returns; `output_names`
  // holds the names of its tensor leaves, in the order of the call's outputs.
  absl::InlinedVector<const std::string*, 8>& output_names = s.output_names;
  for (const auto& leaf : entry.outputs().leaves()) {
    if (leaf.is_tensor()) output_names.push_back(&leaf.name());
  }
  std::vector<bool>& wanted = s.wanted;
  wanted.assign(output_names.size(), request.outputs_size() == 0);
  if (sequences != nullptr) {
    s.state_outputs.assign(output_names.size(), false);
    for (size_t i = 0; i < output_names.size(); ++i) {
      if (sequences->ForOutput(*output_names[i]) != nullptr) {
        wanted[i] = false;
        s.state_outputs[i] = true;
      }
    }
  }
  for (const auto& out : request.outputs()) {
    if (sequences != nullptr && sequences->ForOutput(out.name()) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output '", out.name(), "' of model '", request.model_name(),
          "' is its sequences' state (sequence_batching in its config.pbtxt): the server "
          "keeps it for the sequence's next request and does not send it"));
    }
    int index = -1;
    for (size_t i = 0; i < output_names.size(); ++i) {
      if (out.name() == *output_names[i]) index = static_cast<int>(i);
    }
    if (index >= 0) {
      wanted[index] = true;
      continue;
    }
    for (const auto& leaf : entry.outputs().leaves()) {
      if (leaf.name() == out.name()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "output '", out.name(), "' of model '", request.model_name(),
            "' is not a tensor (", leaf.python_type(), "): only tensors are sent"));
      }
    }
    std::vector<absl::string_view> names(output_names.size());
    for (size_t i = 0; i < names.size(); ++i) names[i] = *output_names[i];
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", request.model_name(), "' has no output '", out.name(),
        "' (its outputs: ", absl::StrJoin(names, ", "), ")"));
  }

  // Last, so that a request refused above leaves its sequence as it was.
  if (sequences != nullptr) {
    if (absl::Status joined = JoinSequence(call, s, *sequences); !joined.ok()) return joined;
  }

  s.model_start = absl::Now();
  s.timing.input = s.model_start - start;
  s.Mark("COMPUTE_INPUT_END", s.model_start);
  return absl::OkStatus();
}

absl::Status InferenceApi::JoinSequence(Call& call, RequestState& s,
                                        const SequenceConfig& sequences) {
  const std::string& model = s.request.model_name();
  if (sequences_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "model '", model, "' keeps sequences' state, which this server holds none of"));
  }
  absl::StatusOr<SequenceParams> params = ReadSequenceParams(s.request);
  if (!params.ok()) return params.status();
  SequenceStore::Request asked;
  asked.model = model;
  asked.loaded = s.handle.model.get();
  asked.id = std::move(params->id);
  asked.start = params->start;
  asked.max_idle = sequences.max_idle;
  asked.client = CertificateFingerprint(call.ClientCertificate());
  absl::StatusOr<SequenceStore::Lease> lease = sequences_->Acquire(asked);
  if (!lease.ok()) return lease.status();
  s.sequence.emplace(*std::move(lease));
  s.sequence_end = params->end;
  // Pinned here: the store replaces the sequence's state when it commits.
  s.sequence_state = s.sequence->state();
  for (const auto& [input, tensor] : s.sequence_state) {
    TensorArg arg;
    arg.dtype = tensor.dtype;
    arg.device = tensor.device;
    arg.shape = tensor.shape;
    arg.data = tensor.data;
    arg.nbytes = tensor.nbytes;
    s.args.push_back({input, std::move(arg)});
  }
  return absl::OkStatus();
}

absl::Status InferenceApi::RunModel(Call& call, RequestState& s, bool* deferred) {
  // Polled before each frame runs and in eager programs' loops: a request
  // whose client has gone, or that ran past its deadline or the server's
  // limit, stops there instead of running on.
  LoadedVersion::CallContext context;
  context.cancelled = [&call, deadline = s.deadline] {
    return call.Cancelled() || absl::Now() >= deadline;
  };
  context.defer_entry_eager = deferred != nullptr;
  if (s.sequence) context.outputs_on_device = &s.state_outputs;
  if (s.trace_id != 0) context.frame_calls = &s.frame_calls;
  s.stage = "running the model";
  absl::StatusOr<CallResult> result = s.handle.model->Call(s.args, context);
  const absl::Time called = absl::Now();
  s.timing.infer += called - s.model_start;
  if (!result.ok()) {
    if (result.status().code() == absl::StatusCode::kCancelled && called >= s.deadline &&
        !call.Cancelled()) {
      return PastDeadline(s, result.status());
    }
    if (s.sequence) return NamingTheState(result.status(), s.sequence_state);
    return result.status();
  }
  if (result->eager_deferred) {
    *deferred = true;
    s.model_start = called;  // InferEager counts the wait from here.
    s.Mark("EAGER_QUEUE_START", called);
    return absl::OkStatus();
  }
  s.Mark("COMPUTE_OUTPUT_START", called);
  if (call.Cancelled()) {
    return absl::CancelledError("the client cancelled the request or its deadline passed");
  }
  return Answer(call, s, *std::move(result), called, s.rows);
}

absl::Status InferenceApi::Answer(Call& call, RequestState& s, CallResult result,
                                  absl::Time called, int64_t batch_rows) {
  s.stage = "encoding the response";
  s.outcome = result.outcome == Outcome::kEagerFallback ? RequestOutcome::kEagerFallback
                                                        : RequestOutcome::kVariant;
  inference::ModelInferResponse response;
  response.set_model_name(s.request.model_name());
  response.set_model_version(absl::StrCat(s.handle.version));
  response.set_id(s.request.id());
  static const std::string* const kOutcomeKey = new std::string("precompile_outcome");
  static const std::string* const kVariantKey = new std::string("precompile_variant");
  static const std::string* const kBatchRowsKey = new std::string("precompile_batch_rows");
  auto& params = *response.mutable_parameters();
  params[*kOutcomeKey].set_string_param(std::string(OutcomeName(result.outcome)));
  params[*kVariantKey].set_string_param(result.variant_id);
  if (s.handle.batching != nullptr && s.handle.batching->dynamic) {
    params[*kBatchRowsKey].set_int64_param(batch_rows);
    if (s.batch_padding_rows > 0) {
      static const std::string* const kPaddingKey = new std::string("precompile_batch_padding_rows");
      params[*kPaddingKey].set_int64_param(s.batch_padding_rows);
    }
  }
  std::vector<OutputTensor> outputs;
  if (result.outputs.size() != s.output_names.size()) {
    return absl::InternalError(absl::StrCat(
        "model '", s.request.model_name(), "' returned ", result.outputs.size(),
        " tensors for ", s.output_names.size(), " outputs"));
  }
  SequenceStore::State next_state;
  const SequenceConfig* sequences = s.handle.sequences.get();
  for (size_t i = 0; i < result.outputs.size(); ++i) {
    if (s.sequence) {
      if (const SequenceConfig::State* state = sequences->ForOutput(*s.output_names[i])) {
        next_state.emplace_back(state->input, result.outputs[i]);
      }
    }
    if (!s.wanted[i]) continue;
    if (result.outputs[i].device != DeviceType::kCpu) {
      return absl::InternalError(absl::StrCat("output '", *s.output_names[i],
                                              "' was left in device memory but is to be sent"));
    }
    DescribeOutput(result.outputs[i], *s.output_names[i], &response);
    outputs.push_back(std::move(result.outputs[i]));
  }
  absl::Status encoded = call.Encode(response, outputs);
  // Only an answer that goes out moves its sequence on: a client that
  // gets an error sends the same step again.
  if (encoded.ok() && s.sequence) {
    encoded = s.sequence->Commit(std::move(next_state), s.sequence_end);
  }
  const absl::Time done = absl::Now();
  s.timing.output = done - called;
  s.Mark("COMPUTE_END", done);
  return encoded;
}


void InferenceApi::LogFailure(const std::string& model, bool served,
                              const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    // Bounded: only models the server serves get their own key; a request
    // refused before its model was found may name anything.
    const std::string key = absl::StrCat(served ? model : "", "/", code);
    absl::Time& last = last_logged_[key];
    const absl::Time now = absl::Now();
    if (now - last < absl::Minutes(1)) return;
    last = now;
  }
  spdlog::warn(
      "event=request_failed model={} code={} message=\"{}\" note=\"logged once a minute per "
      "model and code; precompile_requests_total counts every one\"",
      LoggedText(model, kMaxLoggedName), code, LoggedText(status.message(), kMaxLoggedMessage));
}


absl::Status InferenceApi::ModelStatistics(const inference::ModelStatisticsRequest& request,
                                           inference::ModelStatisticsResponse* response) const {
  // Every served version of every model, or of the model asked for, or the
  // one version asked for: as Triton answers.
  std::vector<std::pair<ModelState, ModelRepository::Handle>> models;
  if (request.name().empty()) {
    models = repository_.Served();
    std::sort(models.begin(), models.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.first.name, -a.second.version) <
             std::make_pair(b.first.name, -b.second.version);
    });
  } else {
    ModelState state;
    state.name = request.name();
    if (request.version().empty()) {
      auto handles = repository_.GetVersions(request.name());
      if (!handles.ok()) return handles.status();
      for (ModelRepository::Handle& handle : *handles) models.emplace_back(state, std::move(handle));
    } else {
      auto handle = repository_.Get(request.name(), request.version());
      if (!handle.ok()) return handle.status();
      models.emplace_back(state, *std::move(handle));
    }
  }
  for (const auto& [state, handle] : models) {
    auto* stats = response->add_model_stats();
    stats->set_name(state.name);
    stats->set_version(absl::StrCat(handle.version));
    if (!handle.metrics) continue;
    const InferStatistics s = handle.metrics->Statistics();
    stats->set_last_inference(s.last_inference_ms);
    // As Triton counts them: each row of a batching model's request is an
    // inference, each run of the model (one for a merged batch) an execution.
    stats->set_inference_count(s.inference_count);
    stats->set_execution_count(s.execution_count);
    auto set = [](inference::StatisticDuration* d, uint64_t count, uint64_t ns) {
      d->set_count(count);
      d->set_ns(ns);
    };
    auto* infer = stats->mutable_inference_stats();
    set(infer->mutable_success(), s.success_count, s.success_ns);
    set(infer->mutable_fail(), s.fail_count, s.fail_ns);
    set(infer->mutable_queue(), s.queue_count, s.queue_ns);
    set(infer->mutable_compute_input(), s.input_count, s.input_ns);
    set(infer->mutable_compute_infer(), s.infer_count, s.infer_ns);
    set(infer->mutable_compute_output(), s.output_count, s.output_ns);
  }
  return absl::OkStatus();
}

void InferenceApi::RepositoryIndex(const inference::RepositoryIndexRequest& request,
                                   inference::RepositoryIndexResponse* response) const {
  // One entry per served version, as Triton lists them; one for a model
  // with none served.
  for (const ModelState& state : repository_.List()) {
    if (request.ready() && state.phase != ModelState::Phase::kReady) continue;
    auto add = [&](int64_t version) {
      auto* m = response->add_models();
      m->set_name(state.name);
      if (version > 0) m->set_version(absl::StrCat(version));
      m->set_state(PhaseName(state.phase));
      m->set_reason(state.reason);
    };
    if (state.versions.empty()) add(0);
    for (const int64_t version : state.versions) add(version);
  }
}

absl::Status InferenceApi::LoadModel(const std::string& name) {
  return repository_.Load(name).status();
}

absl::Status InferenceApi::UnloadModel(const std::string& name) {
  return repository_.Unload(name).status();
}

absl::StatusOr<RequestTracer::Settings> InferenceApi::TraceSetting(
    const std::string& model, const RequestTracer::Changes& changes) {
  if (tracer_ == nullptr) return absl::UnimplementedError("this server traces no requests");
  // Settings are kept per model named: only for models the server serves,
  // so that clients cannot grow the table with names of their own.
  if (!model.empty()) {
    if (absl::StatusOr<ModelRepository::Handle> served = repository_.Get(model, "");
        !served.ok()) {
      return served.status();
    }
  }
  if (changes.empty()) return tracer_->Get(model);
  return tracer_->Update(model, changes);
}

}  // namespace precompile::server
