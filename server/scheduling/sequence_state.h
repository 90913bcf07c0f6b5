// Sequences whose state stays on the server, as Triton's users ask for
// them in a model's config.pbtxt (`sequence_batching { state [...] }`):
// what the config says, whether the artifact can honour it, and the state
// every active sequence holds between its requests. No torch, no threads.
//
// A request of a sequence carries Triton's parameters sequence_id (a
// positive integer or a non-empty string), sequence_start and sequence_end.
// Each state names a tensor output of the model and the input it becomes
// in the sequence's next request: the server keeps the output instead of
// sending it, and passes it back instead of the client. A sequence's first
// request has no state (those inputs are left out, so the model must
// accept them missing: a decoder's prefill without a cache). Its last one,
// marked sequence_end, drops it. A sequence's requests run one at a time.
//
// The state is memory any client can ask the server to hold, so it is
// bounded: a sequence idle past the model's max_sequence_idle_microseconds
// is dropped, and the state of all sequences together stays within a
// budget (the sequence idle longest goes first). A request of a sequence
// that is gone is refused, saying why, for as long as the store remembers
// it.
#ifndef PRECOMPILE_SERVER_SCHEDULING_SEQUENCE_STATE_H_
#define PRECOMPILE_SERVER_SCHEDULING_SEQUENCE_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/artifact.pb.h"
#include "proto/model_config.pb.h"
#include "runtime/value.h"

namespace precompile::server {

struct SequenceConfig {
  struct State {
    // The entry's tensor input it fills, and the output that becomes it.
    std::string input;
    std::string output;
  };
  std::vector<State> states;
  // A sequence with no request for this long is dropped.
  absl::Duration max_idle;

  // The state whose input, or whose output, is `name`; null for none.
  const State* ForInput(absl::string_view name) const;
  const State* ForOutput(absl::string_view name) const;
};

// The sequences a model's config asks for: null when it asks for none.
// INVALID_ARGUMENT, prefixed "config.pbtxt: ", for what this server does
// not honour (control inputs, initial state, iterative sequences, batching
// across sequences) and for states that name no tensor or one twice.
absl::StatusOr<std::shared_ptr<const SequenceConfig>> ReadSequenceConfig(
    const inference::ModelConfig& config);

// Whether the artifact's entry frame can keep `config`'s state: each
// state's input is a tensor argument that may be left out, each output a
// tensor the entry returns. FAILED_PRECONDITION naming the state that
// cannot.
absl::Status CheckSequenceState(const artifact::v1::Frame& entry, const SequenceConfig& config);

// A request's sequence_id, as messages quote it: 7, or "abc" quoted.
// Distinct ids have distinct texts.
struct SequenceId {
  std::string text;
};

// The longest string sequence_id accepted, in bytes.
inline constexpr size_t kMaxSequenceIdBytes = 128;

class SequenceStore {
 public:
  // A sequence's state: tensors by the input they fill.
  using State = std::vector<std::pair<std::string, OutputTensor>>;

  struct Options {
    // The state of all sequences together, in bytes (each sequence counts
    // kSequenceOverheadBytes besides its tensors). 0: no sequence may start.
    int64_t max_bytes = int64_t{1} << 30;
    // The most one client's sequences hold together (Request::client: one
    // certificate, or all clients without one); past it that client's own
    // sequence idle longest is evicted, so that a client cannot push the
    // others' out beyond its share. 0: no share, only max_bytes.
    int64_t max_bytes_per_client = 0;
    // Sequences gone that the store remembers, to say why they are.
    size_t remembered = 4096;
    // Null: absl::Now.
    std::function<absl::Time()> clock;
  };

  // What a sequence costs besides its tensors, so that many sequences of
  // little state are bounded too.
  static constexpr int64_t kSequenceOverheadBytes = 1024;

  // What a request asks of its sequence.
  struct Request {
    std::string model;
    // Tells loads of the model apart: the state of one is no input of another.
    const void* loaded = nullptr;
    SequenceId id;
    // Who asks: the fingerprint of the certificate the client presented
    // (mutual TLS), or empty. Each client has ids of its own: a request
    // reaches only sequences that a client of the same certificate started,
    // so one client can neither continue, end nor restart another's. Clients
    // without a certificate share one set of ids, as in Triton.
    std::string client;
    bool start = false;
    absl::Duration max_idle;
  };

  // A request's hold on its sequence, from Acquire until its answer.
  // Destroyed without Commit (the request failed), the sequence keeps the
  // state it had; a sequence whose first request failed does not start.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();

    // Empty for the first request of a sequence.
    const State& state() const { return *state_; }
    // The request succeeded: `next` becomes the sequence's state, or with
    // `end` the sequence ends. RESOURCE_EXHAUSTED, keeping the state it
    // had, when `next` does not fit the budget even after evicting every
    // idle sequence.
    absl::Status Commit(State next, bool end);

   private:
    friend class SequenceStore;
    Lease(SequenceStore* store, std::string key, const State* state)
        : store_(store), key_(std::move(key)), state_(state) {}
    SequenceStore* store_;
    std::string key_;
    const State* state_;
  };

  // Per model, for its metrics.
  struct ModelStats {
    std::string model;
    int64_t active = 0;
    int64_t state_bytes = 0;  // Its tensors' bytes, without the overhead.
    uint64_t ended = 0;
    uint64_t expired = 0;  // Idle past max_sequence_idle_microseconds.
    uint64_t evicted = 0;  // To keep within the budget.
  };

  explicit SequenceStore(Options options);
  SequenceStore(const SequenceStore&) = delete;
  SequenceStore& operator=(const SequenceStore&) = delete;
  // REQUIRES: no lease is alive.
  ~SequenceStore();

  // The sequence's state for one request; with `start`, a new sequence
  // (replacing one of the same id, which then ends). ABORTED while another
  // request of the sequence runs; FAILED_PRECONDITION, saying why, for a
  // sequence that is not active (never started, ended, expired, evicted,
  // or started on another load of the model) and not started by this
  // request; RESOURCE_EXHAUSTED when a new sequence does not fit the budget.
  absl::StatusOr<Lease> Acquire(const Request& request);

  // Every model that has had a sequence, by name, after dropping the
  // sequences idle past their limit.
  std::vector<ModelStats> Stats();
  int64_t max_bytes() const { return options_.max_bytes; }

 private:
  enum class Gone { kEnded, kExpired, kEvicted, kEvictedByShare, kReloaded, kFailedStart };
  struct Entry {
    std::string client;
    std::string model;
    std::string id;
    const void* loaded = nullptr;
    State state;
    int64_t bytes = 0;  // With the overhead (OverheadBytes).
    absl::Duration max_idle;
    absl::Time last_used;
    bool busy = false;
    // A request of it succeeded: it has started.
    bool committed = false;
  };
  struct Remembered {
    Gone why;
    absl::Duration max_idle;
    uint64_t serial = 0;
  };

  // What a client's sequences hold, and of that their idle ones.
  struct ClientBytes {
    int64_t held = 0;
    int64_t idle = 0;
  };
  // Which limit a state cannot fit.
  enum class Limit { kShare, kTotal };

  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `key`'s entry, remembering why it went.
  void Drop(const std::string& key, Gone why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetIdle(const std::string& key, Entry& entry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes an idle `entry` out of the idle sets.
  void SetBusy(const std::string& key, Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room for `bytes` more of `client`'s state: evicts the client's own
  // idle sequences, the one idle longest first, until they fit its share,
  // then anyone's until they fit max_bytes. The limit they cannot fit even
  // so, evicting none; nullopt when they fit.
  std::optional<Limit> MakeRoom(const std::string& client, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string GoneText(const Remembered& gone) const;
  void Release(const std::string& key);
  absl::Status Commit(const std::string& key, State next, bool end);

  const Options options_;
  std::mutex mu_;
  // By model and id; nodes keep their place, so leases point at states.
  absl::node_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // The idle sequences, by when they expire and by when last used.
  std::set<std::pair<absl::Time, std::string>> idle_by_expiry_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, std::string>> idle_by_use_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Per client, while it has sequences; and its idle ones by when last used.
  absl::flat_hash_map<std::string, ClientBytes> client_bytes_ ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<std::string, absl::Time, std::string>> idle_by_client_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ModelStats> stats_ ABSL_GUARDED_BY(mu_);
  // Why sequences went, oldest first, bounded by options_.remembered.
  absl::flat_hash_map<std::string, Remembered> gone_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::string, uint64_t>> gone_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SCHEDULING_SEQUENCE_STATE_H_
