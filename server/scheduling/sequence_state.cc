#include "server/scheduling/sequence_state.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace precompile::server {
namespace {

using artifact::v1::Frame;
using artifact::v1::Parameter;

// Triton's default.
constexpr absl::Duration kDefaultMaxIdle = absl::Seconds(1);
// Longer is a misconfiguration, and keeps the arithmetic finite.
constexpr uint64_t kMaxIdleMicros = uint64_t{86'400} * 1'000'000;

absl::Status ConfigError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.pbtxt: sequence_batching ", what));
}

std::string KeyOf(absl::string_view client, absl::string_view model, absl::string_view id) {
  // Neither a client's fingerprint nor a model name holds a NUL: the three
  // are told apart.
  const std::string nul(1, '\0');
  return absl::StrCat(client, nul, model, nul, id);
}

// What a sequence keyed `key` counts besides its tensors.
int64_t OverheadBytes(const std::string& key) {
  return SequenceStore::kSequenceOverheadBytes + static_cast<int64_t>(key.size());
}

std::string Describe(absl::string_view model, absl::string_view id) {
  return absl::StrCat("sequence ", id, " of model '", model, "'");
}

}  // namespace

const SequenceConfig::State* SequenceConfig::ForInput(absl::string_view name) const {
  for (const State& state : states) {
    if (state.input == name) return &state;
  }
  return nullptr;
}

const SequenceConfig::State* SequenceConfig::ForOutput(absl::string_view name) const {
  for (const State& state : states) {
    if (state.output == name) return &state;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const SequenceConfig>> ReadSequenceConfig(
    const inference::ModelConfig& config) {
  if (!config.has_sequence_batching()) return nullptr;
  const inference::ModelSequenceBatching& asked = config.sequence_batching();
  if (config.max_batch_size() != 0) {
    return ConfigError(absl::StrCat(
        "with max_batch_size ", config.max_batch_size(),
        " is not supported: each sequence's requests run alone (max_batch_size: 0)"));
  }
  if (asked.control_input_size() != 0) {
    return ConfigError(
        "{ control_input } is not supported: sequence_id, sequence_start and sequence_end "
        "travel as request parameters and are not the model's inputs");
  }
  if (asked.iterative_sequence()) return ConfigError("{ iterative_sequence } is not supported");
  if (asked.max_sequence_idle_microseconds() > kMaxIdleMicros) {
    return ConfigError(absl::StrCat("{ max_sequence_idle_microseconds } is ",
                                    asked.max_sequence_idle_microseconds(),
                                    ", past the limit of ", kMaxIdleMicros, " (a day)"));
  }
  auto sequences = std::make_shared<SequenceConfig>();
  sequences->max_idle =
      asked.max_sequence_idle_microseconds() == 0
          ? kDefaultMaxIdle
          : absl::Microseconds(static_cast<int64_t>(asked.max_sequence_idle_microseconds()));
  absl::flat_hash_set<std::string> inputs, outputs;
  for (const auto& state : asked.state()) {
    if (state.input_name().empty() || state.output_name().empty()) {
      return ConfigError("{ state } needs an input_name and an output_name");
    }
    if (state.initial_state_size() != 0) {
      return ConfigError(absl::StrCat(
          "{ state { initial_state } } of '", state.input_name(),
          "' is not supported: a sequence's first request runs without its state"));
    }
    if (!inputs.insert(state.input_name()).second) {
      return ConfigError(absl::StrCat("names input '", state.input_name(), "' twice"));
    }
    if (!outputs.insert(state.output_name()).second) {
      return ConfigError(absl::StrCat("names output '", state.output_name(), "' twice"));
    }
    sequences->states.push_back({state.input_name(), state.output_name()});
  }
  if (sequences->states.empty()) {
    return ConfigError(
        "names no state { input_name output_name }: without state a request needs no "
        "sequence");
  }
  return sequences;
}

absl::Status CheckSequenceState(const Frame& entry, const SequenceConfig& config) {
  for (const SequenceConfig::State& state : config.states) {
    const Parameter* input = nullptr;
    for (const Parameter& p : entry.parameters()) {
      if (p.name() == state.input) input = &p;
    }
    if (input == nullptr ||
        (input->kind() != Parameter::TENSOR && input->kind() != Parameter::OPTIONAL_TENSOR)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence_batching { state } names input '", state.input,
          "', which is not a tensor input of the model"));
    }
    if (!input->has_default_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence_batching { state } names input '", state.input,
          "', which a call may not leave out: a sequence's first request runs without its "
          "state"));
    }
    bool returned = false;
    for (const auto& leaf : entry.outputs().leaves()) {
      returned |= leaf.is_tensor() && leaf.name() == state.output;
    }
    if (!returned) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence_batching { state } names output '", state.output,
          "', which is not a tensor output of the model"));
    }
  }
  return absl::OkStatus();
}

SequenceStore::SequenceStore(Options options) : options_(std::move(options)) {}

SequenceStore::~SequenceStore() = default;

SequenceStore::Lease::Lease(Lease&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      key_(std::move(other.key_)),
      state_(other.state_) {}

SequenceStore::Lease::~Lease() {
  if (store_ != nullptr) store_->Release(key_);
}

absl::Status SequenceStore::Lease::Commit(State next, bool end) {
  SequenceStore* store = std::exchange(store_, nullptr);
  if (store == nullptr) return absl::InternalError("a sequence's lease was committed twice");
  return store->Commit(key_, std::move(next), end);
}

absl::StatusOr<SequenceStore::Lease> SequenceStore::Acquire(const Request& request) {
  const std::string key = KeyOf(request.client, request.model, request.id.text);
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = Now();
  DropExpired(now);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry& entry = it->second;
    if (entry.busy) {
      return absl::AbortedError(absl::StrCat(
          Describe(request.model, request.id.text),
          " has a request running: a sequence's requests run one at a time, each sent after "
          "the answer to the one before"));
    }
    if (entry.loaded != request.loaded) {
      Drop(key, Gone::kReloaded);
    } else if (request.start) {
      // Started again: the old sequence ends here.
      Drop(key, Gone::kEnded);
    } else {
      SetBusy(key, entry);
      return Lease(this, key, &entry.state);
    }
  }
  if (!request.start) {
    auto gone = gone_.find(key);
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(request.model, request.id.text), " is not active: ",
        gone != gone_.end()
            ? absl::StrCat("it ", GoneText(gone->second),
                           "; start it again with sequence_start")
            : std::string("a sequence's first request carries sequence_start")));
  }
  const int64_t bytes = OverheadBytes(key);
  const std::optional<Limit> full = MakeRoom(request.client, bytes);
  if (full == Limit::kShare) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client's sequences hold ", client_bytes_[request.client].held,
        " bytes of state in requests running now, its share (--sequence_state_bytes_per_client ",
        options_.max_bytes_per_client, "): none of its sequences can start; retry later"));
  }
  if (full == Limit::kTotal) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server holds ", bytes_, " bytes of sequence state in requests running now, "
        "the most it may (--sequence_state_bytes ", options_.max_bytes,
        "): no sequence can start; retry later"));
  }
  Entry& entry = entries_[key];
  entry.client = request.client;
  client_bytes_[request.client].held += bytes;
  entry.model = request.model;
  entry.id = request.id.text;
  entry.loaded = request.loaded;
  entry.max_idle = request.max_idle;
  entry.bytes = bytes;
  entry.busy = true;
  entry.last_used = now;
  bytes_ += bytes;
  ModelStats& stats = stats_[request.model];
  stats.model = request.model;
  ++stats.active;
  return Lease(this, key, &entry.state);
}

void SequenceStore::Release(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (!it->second.committed) {
    Drop(key, Gone::kFailedStart);
    return;
  }
  SetIdle(key, it->second, Now());
}

absl::Status SequenceStore::Commit(const std::string& key, State next, bool end) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return absl::InternalError("a sequence vanished while it ran");
  Entry& entry = it->second;
  const absl::Time now = Now();
  if (end) {
    Drop(key, Gone::kEnded);
    return absl::OkStatus();
  }
  int64_t tensors = 0;
  for (const auto& [name, tensor] : next) tensors += static_cast<int64_t>(tensor.nbytes);
  const int64_t bytes = OverheadBytes(key) + tensors;
  const int64_t more = bytes - entry.bytes;
  if (const std::optional<Limit> full = MakeRoom(entry.client, more)) {
    const std::string who = Describe(entry.model, entry.id);
    const bool share = *full == Limit::kShare;
    const int64_t others = (share ? client_bytes_[entry.client].held : bytes_) - entry.bytes;
    std::string message =
        share ? absl::StrCat("this client's other sequences running now hold ", others,
                             ": together past its share, --sequence_state_bytes_per_client (",
                             options_.max_bytes_per_client)
              : absl::StrCat("the server's other sequences running now hold ", others,
                             ": together past --sequence_state_bytes (", options_.max_bytes);
    if (!entry.committed) {
      Drop(key, Gone::kFailedStart);
    } else {
      SetIdle(key, entry, now);
    }
    return absl::ResourceExhaustedError(absl::StrCat("the state of ", who, " would take ", tensors,
                                                     " bytes, and ", message,
                                                     "); the sequence keeps the state it had"));
  }
  client_bytes_[entry.client].held += more;
  ModelStats& stats = stats_[entry.model];
  stats.state_bytes += more;
  bytes_ += more;
  entry.bytes = bytes;
  entry.state = std::move(next);
  entry.committed = true;
  SetIdle(key, entry, now);
  return absl::OkStatus();
}

std::optional<SequenceStore::Limit> SequenceStore::MakeRoom(const std::string& client,
                                                            int64_t bytes) {
  if (bytes <= 0) return std::nullopt;
  const int64_t share = options_.max_bytes_per_client;
  auto own = [&] {
    auto it = client_bytes_.find(client);
    return it == client_bytes_.end() ? ClientBytes{} : it->second;
  };
  // What would stay if every idle sequence that may go went.
  if (share > 0 && own().held - own().idle + bytes > share) return Limit::kShare;
  if (bytes_ - idle_bytes_ + bytes > options_.max_bytes) return Limit::kTotal;
  while (share > 0 && own().held + bytes > share) {
    auto idle = idle_by_client_.lower_bound({client, absl::InfinitePast(), std::string()});
    if (idle == idle_by_client_.end() || std::get<0>(*idle) != client) break;
    const std::string oldest = std::get<2>(*idle);
    Drop(oldest, Gone::kEvictedByShare);
  }
  while (bytes_ + bytes > options_.max_bytes && !idle_by_use_.empty()) {
    const std::string oldest = idle_by_use_.begin()->second;
    Drop(oldest, Gone::kEvicted);
  }
  return std::nullopt;
}

void SequenceStore::DropExpired(absl::Time now) {
  while (!idle_by_expiry_.empty() && idle_by_expiry_.begin()->first <= now) {
    const std::string key = idle_by_expiry_.begin()->second;
    Drop(key, Gone::kExpired);
  }
}

void SequenceStore::SetBusy(const std::string& key, Entry& entry) {
  idle_by_expiry_.erase({entry.last_used + entry.max_idle, key});
  idle_by_use_.erase({entry.last_used, key});
  idle_by_client_.erase({entry.client, entry.last_used, key});
  idle_bytes_ -= entry.bytes;
  client_bytes_[entry.client].idle -= entry.bytes;
  entry.busy = true;
}

void SequenceStore::SetIdle(const std::string& key, Entry& entry, absl::Time now) {
  entry.busy = false;
  entry.last_used = now;
  idle_by_expiry_.insert({now + entry.max_idle, key});
  idle_by_use_.insert({now, key});
  idle_by_client_.insert({entry.client, now, key});
  idle_bytes_ += entry.bytes;
  client_bytes_[entry.client].idle += entry.bytes;
}

void SequenceStore::Drop(const std::string& key, Gone why) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (!entry.busy) SetBusy(key, entry);
  bytes_ -= entry.bytes;
  if (auto client = client_bytes_.find(entry.client);
      client != client_bytes_.end() && (client->second.held -= entry.bytes) <= 0) {
    client_bytes_.erase(client);
  }
  ModelStats& stats = stats_[entry.model];
  --stats.active;
  stats.state_bytes -= entry.bytes - OverheadBytes(key);
  switch (why) {
    case Gone::kEnded: ++stats.ended; break;
    case Gone::kExpired: ++stats.expired; break;
    case Gone::kEvicted:
    case Gone::kEvictedByShare: ++stats.evicted; break;
    case Gone::kReloaded:
    case Gone::kFailedStart: break;
  }
  const uint64_t serial = next_serial_++;
  gone_[key] = Remembered{why, entry.max_idle, serial};
  gone_order_.emplace_back(key, serial);
  while (gone_order_.size() > options_.remembered) {
    auto oldest = gone_.find(gone_order_.front().first);
    if (oldest != gone_.end() && oldest->second.serial == gone_order_.front().second) {
      gone_.erase(oldest);
    }
    gone_order_.pop_front();
  }
  entries_.erase(it);
}

std::string SequenceStore::GoneText(const Remembered& gone) const {
  switch (gone.why) {
    case Gone::kEnded: return "ended (a request marked sequence_end, or a new sequence_start)";
    case Gone::kExpired:
      return absl::StrCat("was dropped after ", absl::FormatDuration(gone.max_idle),
                          " without a request (max_sequence_idle_microseconds in the model's "
                          "config.pbtxt)");
    case Gone::kEvicted:
      return absl::StrCat("was evicted to keep the server's sequence state within "
                          "--sequence_state_bytes (",
                          options_.max_bytes, "; the sequence idle longest goes first)");
    case Gone::kEvictedByShare:
      return absl::StrCat("was evicted to keep its client's sequence state within "
                          "--sequence_state_bytes_per_client (",
                          options_.max_bytes_per_client,
                          "; the client's own sequence idle longest goes first)");
    case Gone::kReloaded:
      return "was dropped: the model was loaded again after it started";
    case Gone::kFailedStart: return "never started: its first request failed";
  }
  return "is gone";
}

std::vector<SequenceStore::ModelStats> SequenceStore::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  DropExpired(Now());
  std::vector<ModelStats> stats;
  for (const auto& [model, s] : stats_) stats.push_back(s);
  std::sort(stats.begin(), stats.end(),
            [](const ModelStats& a, const ModelStats& b) { return a.model < b.model; });
  return stats;
}

}  // namespace precompile::server
