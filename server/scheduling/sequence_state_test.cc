#include "server/scheduling/sequence_state.h"

#include <google/protobuf/text_format.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<const SequenceConfig>> Read(const std::string& text) {
  inference::ModelConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return ReadSequenceConfig(config);
}

TEST(ReadSequenceConfig, ReadsTritonsImplicitState) {
  auto none = Read("");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  auto config = Read(
      "sequence_batching { max_sequence_idle_microseconds: 5000000 "
      "state [ { input_name: 'past.k' output_name: 'next.k' data_type: TYPE_FP32 dims: [-1] },"
      " { input_name: 'past.v' output_name: 'next.v' } ] }");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_NE(*config, nullptr);
  EXPECT_EQ((*config)->max_idle, absl::Seconds(5));
  ASSERT_EQ((*config)->states.size(), 2u);
  EXPECT_EQ((*config)->ForOutput("next.v")->input, "past.v");
  EXPECT_EQ((*config)->ForInput("past.k")->output, "next.k");
  EXPECT_EQ((*config)->ForInput("next.k"), nullptr);

  auto idle_default = Read("sequence_batching { state { input_name: 'a' output_name: 'b' } }");
  ASSERT_TRUE(idle_default.ok()) << idle_default.status();
  EXPECT_EQ((*idle_default)->max_idle, absl::Seconds(1)) << "Triton's default";
}

TEST(ReadSequenceConfig, RefusesWhatItDoesNotHonour) {
  const std::string state = "state { input_name: 'a' output_name: 'b' }";
  EXPECT_THAT(Read("sequence_batching { }").status().message(), HasSubstr("names no state"));
  EXPECT_THAT(Read("max_batch_size: 4 sequence_batching { " + state + " }").status().message(),
              HasSubstr("max_batch_size 4 is not supported"));
  EXPECT_THAT(Read("sequence_batching { " + state +
                   " control_input { name: 'START' control { kind: CONTROL_SEQUENCE_START "
                   "int32_false_true: [0, 1] } } }")
                  .status()
                  .message(),
              HasSubstr("control_input } is not supported"));
  EXPECT_THAT(Read("sequence_batching { state { input_name: 'a' output_name: 'b' "
                   "initial_state { zero_data: true name: 'z' } } }")
                  .status()
                  .message(),
              HasSubstr("initial_state } } of 'a' is not supported"));
  EXPECT_THAT(Read("sequence_batching { state [ { input_name: 'a' output_name: 'b' }, "
                   "{ input_name: 'a' output_name: 'c' } ] }")
                  .status()
                  .message(),
              HasSubstr("names input 'a' twice"));
  EXPECT_THAT(Read("sequence_batching { state [ { input_name: 'a' output_name: 'b' }, "
                   "{ input_name: 'c' output_name: 'b' } ] }")
                  .status()
                  .message(),
              HasSubstr("names output 'b' twice"));
  EXPECT_THAT(Read("sequence_batching { state { input_name: 'a' } }").status().message(),
              HasSubstr("needs an input_name and an output_name"));
  EXPECT_THAT(Read("sequence_batching { max_sequence_idle_microseconds: 18446744073709551615 " +
                   state + " }")
                  .status()
                  .message(),
              HasSubstr("past the limit"));
  EXPECT_THAT(Read("sequence_batching { iterative_sequence: true " + state + " }")
                  .status()
                  .message(),
              HasSubstr("iterative_sequence"));
}

artifact::v1::Frame DecoderFrame() {
  artifact::v1::Frame frame;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        parameters { name: "input_ids" kind: TENSOR }
        parameters { name: "past" kind: OPTIONAL_TENSOR default_value {} }
        parameters { name: "steps" kind: INT default_value { int_value: 1 } }
        outputs {
          leaves { name: "logits" is_tensor: true }
          leaves { name: "past" is_tensor: true }
          leaves { name: "note" }
        }
      )pb",
      &frame));
  return frame;
}

TEST(CheckSequenceState, NeedsInputsThatMayBeLeftOutAndTensorOutputs) {
  const artifact::v1::Frame frame = DecoderFrame();
  SequenceConfig config;
  config.states = {{"past", "past"}};
  EXPECT_TRUE(CheckSequenceState(frame, config).ok());

  config.states = {{"input_ids", "past"}};
  EXPECT_THAT(CheckSequenceState(frame, config).message(),
              HasSubstr("input 'input_ids', which a call may not leave out"));
  config.states = {{"steps", "past"}};
  EXPECT_THAT(CheckSequenceState(frame, config).message(),
              HasSubstr("'steps', which is not a tensor input"));
  config.states = {{"cache", "past"}};
  EXPECT_THAT(CheckSequenceState(frame, config).message(),
              HasSubstr("'cache', which is not a tensor input"));
  config.states = {{"past", "note"}};
  EXPECT_THAT(CheckSequenceState(frame, config).message(),
              HasSubstr("output 'note', which is not a tensor output"));
}

// A fake clock at the system's edge: the store's expiry is what is tested.
class SequenceStoreTest : public ::testing::Test {
 protected:
  SequenceStore MakeStore(int64_t max_bytes, int64_t max_bytes_per_client = 0) {
    SequenceStore::Options options;
    options.max_bytes = max_bytes;
    options.max_bytes_per_client = max_bytes_per_client;
    options.remembered = 3;
    options.clock = [this] { return now_; };
    return SequenceStore(options);
  }

  SequenceStore::Request Ask(const std::string& id, bool start, const void* loaded = nullptr,
                             const std::string& client = "") {
    SequenceStore::Request request;
    request.client = client;
    request.model = "decoder";
    request.loaded = loaded != nullptr ? loaded : &model_;
    request.id.text = id;
    request.start = start;
    request.max_idle = absl::Seconds(10);
    return request;
  }

  // A state of one tensor of `bytes` bytes holding `value` in its first byte.
  static SequenceStore::State StateOf(int64_t bytes, uint8_t value) {
    auto data = std::shared_ptr<uint8_t[]>(new uint8_t[bytes]());
    data[0] = value;
    OutputTensor t;
    t.dtype = DType::kUInt8;
    t.shape = {bytes};
    t.data = data.get();
    t.nbytes = static_cast<size_t>(bytes);
    t.owner = std::shared_ptr<const void>(data, data.get());
    return {{"past", t}};
  }

  static uint8_t FirstByte(const SequenceStore::Lease& lease) {
    return static_cast<const uint8_t*>(lease.state().at(0).second.data)[0];
  }

  static int64_t Overhead(const std::string& id) {
    // The key: no client, a NUL, "decoder", a NUL, the id.
    return SequenceStore::kSequenceOverheadBytes + static_cast<int64_t>(id.size() + 9);
  }

  absl::Time now_ = absl::UnixEpoch();
  static int model_;
  int reloaded_ = 0;
};

int SequenceStoreTest::model_ = 0;

TEST_F(SequenceStoreTest, StateGoesFromOneRequestToTheNextAndEndsWithTheSequence) {
  SequenceStore store = MakeStore(1 << 20);
  {
    auto first = store.Acquire(Ask("7", /*start=*/true));
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE(first->state().empty()) << "a sequence starts without state";
    ASSERT_TRUE(first->Commit(StateOf(100, 1), false).ok());
  }
  {
    auto second = store.Acquire(Ask("7", false));
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(FirstByte(*second), 1);
    ASSERT_TRUE(second->Commit(StateOf(200, 2), false).ok());
  }
  auto stats = store.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].active, 1);
  EXPECT_EQ(stats[0].state_bytes, 200);
  {
    auto last = store.Acquire(Ask("7", false));
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(FirstByte(*last), 2);
    ASSERT_TRUE(last->Commit(StateOf(300, 3), /*end=*/true).ok());
  }
  stats = store.Stats();
  EXPECT_EQ(stats[0].active, 0);
  EXPECT_EQ(stats[0].state_bytes, 0);
  EXPECT_EQ(stats[0].ended, 1u);
  auto resumed = store.Acquire(Ask("7", false));
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(resumed.status().message(),
              HasSubstr("sequence 7 of model 'decoder' is not active: it ended"));
}

TEST_F(SequenceStoreTest, AFailedRequestLeavesTheStateItHad) {
  SequenceStore store = MakeStore(1 << 20);
  {
    auto first = store.Acquire(Ask("a", true));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE(first->Commit(StateOf(10, 5), false).ok());
  }
  { auto failed = store.Acquire(Ask("a", false)); }  // Its request failed.
  auto next = store.Acquire(Ask("a", false));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(FirstByte(*next), 5);
}

TEST_F(SequenceStoreTest, ASequenceWhoseFirstRequestFailedNeverStarts) {
  SequenceStore store = MakeStore(1 << 20);
  { auto failed = store.Acquire(Ask("a", true)); }
  auto next = store.Acquire(Ask("a", false));
  EXPECT_THAT(next.status().message(), HasSubstr("never started: its first request failed"));
  EXPECT_EQ(store.Stats()[0].active, 0);
}

TEST_F(SequenceStoreTest, ASequenceRunsOneRequestAtATime) {
  SequenceStore store = MakeStore(1 << 20);
  auto first = store.Acquire(Ask("a", true));
  ASSERT_TRUE(first.ok());
  auto concurrent = store.Acquire(Ask("a", false));
  EXPECT_EQ(concurrent.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(concurrent.status().message(), HasSubstr("has a request running"));
  auto restarted = store.Acquire(Ask("a", true));
  EXPECT_EQ(restarted.status().code(), absl::StatusCode::kAborted)
      << "a start does not take a running sequence's place";
  auto other = store.Acquire(Ask("b", true));
  EXPECT_TRUE(other.ok()) << "other sequences run meanwhile";
}

TEST_F(SequenceStoreTest, AStartReplacesTheSequenceOfTheSameId) {
  SequenceStore store = MakeStore(1 << 20);
  {
    auto first = store.Acquire(Ask("a", true));
    ASSERT_TRUE(first->Commit(StateOf(10, 5), false).ok());
  }
  auto again = store.Acquire(Ask("a", true));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->state().empty());
}

TEST_F(SequenceStoreTest, EachClientCertificateHasSequencesOfItsOwn) {
  SequenceStore store = MakeStore(1 << 20);
  {
    auto alice = store.Acquire(Ask("7", true, nullptr, "alice"));
    ASSERT_TRUE(alice.ok()) << alice.status();
    ASSERT_TRUE(alice->Commit(StateOf(10, 1), false).ok());
  }
  // Another client, or one without a certificate, cannot continue it...
  for (const char* other : {"bob", ""}) {
    auto taken = store.Acquire(Ask("7", false, nullptr, other));
    EXPECT_EQ(taken.status().code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(taken.status().message(),
                HasSubstr("a sequence's first request carries sequence_start"));
  }
  // ...nor end it by starting one of the same id: that is a sequence of its own.
  {
    auto bob = store.Acquire(Ask("7", true, nullptr, "bob"));
    ASSERT_TRUE(bob.ok()) << bob.status();
    EXPECT_TRUE(bob->state().empty());
    ASSERT_TRUE(bob->Commit(StateOf(10, 2), /*end=*/true).ok());
  }
  auto alice = store.Acquire(Ask("7", false, nullptr, "alice"));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(FirstByte(*alice), 1);
  EXPECT_EQ(store.Stats()[0].active, 1);
}

TEST_F(SequenceStoreTest, IdleSequencesExpire) {
  SequenceStore store = MakeStore(1 << 20);
  for (const char* id : {"old", "new"}) {
    auto lease = store.Acquire(Ask(id, true));
    ASSERT_TRUE(lease->Commit(StateOf(10, 1), false).ok());
    now_ += absl::Seconds(6);
  }
  // "old" was last used 12 s ago, "new" 6 s ago; the limit is 10 s.
  auto stats = store.Stats();
  EXPECT_EQ(stats[0].active, 1);
  EXPECT_EQ(stats[0].expired, 1u);
  EXPECT_THAT(store.Acquire(Ask("old", false)).status().message(),
              HasSubstr("was dropped after 10s without a request"));
  auto fresh = store.Acquire(Ask("new", false));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  // Running, it does not expire however long it runs.
  now_ += absl::Seconds(60);
  EXPECT_EQ(store.Stats()[0].active, 1);
  ASSERT_TRUE(fresh->Commit(StateOf(10, 2), false).ok());
  now_ += absl::Seconds(9);
  EXPECT_TRUE(store.Acquire(Ask("new", false)).ok()) << "idle counts from its last answer";
}

TEST_F(SequenceStoreTest, TheBudgetEvictsTheSequenceIdleLongestFirst) {
  // Room for two sequences of 1000 bytes, not three.
  SequenceStore store = MakeStore(2 * (1000 + Overhead("a")) + 500);
  for (const char* id : {"a", "b"}) {
    auto lease = store.Acquire(Ask(id, true));
    ASSERT_TRUE(lease->Commit(StateOf(1000, 1), false).ok());
    now_ += absl::Seconds(1);
  }
  {
    // "a" used again: "b" is now the one idle longest.
    auto a = store.Acquire(Ask("a", false));
    ASSERT_TRUE(a->Commit(StateOf(1000, 2), false).ok());
  }
  {
    auto c = store.Acquire(Ask("c", true));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(c->Commit(StateOf(1000, 3), false).ok());
  }
  EXPECT_THAT(store.Acquire(Ask("b", false)).status().message(),
              HasSubstr("was evicted to keep the server's sequence state within "
                        "--sequence_state_bytes"));
  EXPECT_TRUE(store.Acquire(Ask("a", false)).ok());
  auto stats = store.Stats();
  EXPECT_EQ(stats[0].evicted, 1u);
  EXPECT_EQ(stats[0].active, 2);
}

TEST_F(SequenceStoreTest, AClientPastItsShareEvictsItsOwnSequencesNotOthers) {
  // Room for all, but one client's share holds two sequences of 1000 bytes.
  SequenceStore store = MakeStore(1 << 20, 2 * (1000 + Overhead("a1") + 5) + 500);
  auto start = [&](const std::string& id, const std::string& client) {
    auto lease = store.Acquire(Ask(id, true, nullptr, client));
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(lease->Commit(StateOf(1000, 1), false).ok());
    now_ += absl::Seconds(1);
  };
  start("b1", "bob");  // Idle longest of all.
  start("a1", "alice");
  start("a2", "alice");
  start("a3", "alice");  // Past Alice's share: her own a1 goes, not Bob's b1.
  EXPECT_THAT(store.Acquire(Ask("a1", false, nullptr, "alice")).status().message(),
              HasSubstr("was evicted to keep its client's sequence state within "
                        "--sequence_state_bytes_per_client"));
  EXPECT_TRUE(store.Acquire(Ask("b1", false, nullptr, "bob")).ok());
  {
    // With both of hers running, Alice can start no third; Bob still can.
    auto a2 = store.Acquire(Ask("a2", false, nullptr, "alice"));
    auto a3 = store.Acquire(Ask("a3", false, nullptr, "alice"));
    ASSERT_TRUE(a2.ok() && a3.ok());
    auto a4 = store.Acquire(Ask("a4", true, nullptr, "alice"));
    EXPECT_EQ(a4.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(a4.status().message(),
                HasSubstr("its share (--sequence_state_bytes_per_client"));
    EXPECT_TRUE(store.Acquire(Ask("b2", true, nullptr, "bob")).ok());
    // Nor can one of hers grow past the share while the other runs.
    absl::Status grown = a3->Commit(StateOf(3000, 9), false);
    EXPECT_EQ(grown.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(grown.message(), HasSubstr("this client's other sequences running now hold"));
    EXPECT_THAT(grown.message(), HasSubstr("--sequence_state_bytes_per_client"));
  }
  auto a3 = store.Acquire(Ask("a3", false, nullptr, "alice"));
  ASSERT_TRUE(a3.ok()) << a3.status();
  EXPECT_EQ(FirstByte(*a3), 1) << "the sequence keeps the state it had";
  EXPECT_EQ(store.Stats()[0].evicted, 1u);
}

TEST_F(SequenceStoreTest, StateThatCannotFitIsRefusedAndTheSequenceKeepsItsOwn) {
  SequenceStore store = MakeStore(3000);
  {
    auto lease = store.Acquire(Ask("a", true));
    ASSERT_TRUE(lease->Commit(StateOf(100, 1), false).ok());
  }
  auto running = store.Acquire(Ask("b", true));
  ASSERT_TRUE(running.ok());
  {
    auto a = store.Acquire(Ask("a", false));
    ASSERT_TRUE(a.ok());
    const absl::Status refused = a->Commit(StateOf(5000, 2), false);
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.message(), HasSubstr("past --sequence_state_bytes (3000)"));
  }
  auto a = store.Acquire(Ask("a", false));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(FirstByte(*a), 1);
  // The running sequence is never evicted: with "a" running too, nothing
  // more starts.
  auto c = store.Acquire(Ask("c", true));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("no sequence can start"));
}

TEST_F(SequenceStoreTest, ASequenceOfAnotherLoadOfTheModelIsDropped) {
  SequenceStore store = MakeStore(1 << 20);
  {
    auto lease = store.Acquire(Ask("a", true));
    ASSERT_TRUE(lease->Commit(StateOf(10, 1), false).ok());
  }
  auto other_load = store.Acquire(Ask("a", false, &reloaded_));
  EXPECT_THAT(other_load.status().message(), HasSubstr("the model was loaded again"));
  auto restarted = store.Acquire(Ask("a", true, &reloaded_));
  ASSERT_TRUE(restarted.ok());
  EXPECT_TRUE(restarted->state().empty());
}

TEST_F(SequenceStoreTest, RemembersABoundedNumberOfSequencesGone) {
  SequenceStore store = MakeStore(1 << 20);
  for (const char* id : {"1", "2", "3", "4"}) {
    auto lease = store.Acquire(Ask(id, true));
    ASSERT_TRUE(lease->Commit({}, /*end=*/true).ok());
  }
  EXPECT_THAT(store.Acquire(Ask("1", false)).status().message(),
              HasSubstr("a sequence's first request carries sequence_start"))
      << "forgotten: only 3 are remembered";
  EXPECT_THAT(store.Acquire(Ask("4", false)).status().message(), HasSubstr("it ended"));
  EXPECT_THAT(store.Acquire(Ask("9", false)).status().message(),
              HasSubstr("sequence 9 of model 'decoder' is not active: a sequence's first "
                        "request carries sequence_start"));
}

TEST_F(SequenceStoreTest, ConcurrentRequestsKeepEachSequenceConsistent) {
  // Four threads step their own sequences and contend for a shared one,
  // under a budget that evicts: every step sees the state its sequence's
  // last committed step left, or is refused; none sees another's.
  SequenceStore store = MakeStore(6 * (Overhead("t0") + 64));
  constexpr int kThreads = 4;
  constexpr int kSteps = 300;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string own = "t" + std::to_string(t);
      uint8_t last = 0;  // What `own` holds; 0: not started.
      for (int step = 0; step < kSteps; ++step) {
        const bool start = last == 0;
        auto lease = store.Acquire(Ask(own, start));
        if (lease.ok()) {
          if (!start && FirstByte(*lease) != last) ++wrong[t];
          const uint8_t next = static_cast<uint8_t>(1 + (step + t) % 250);
          if (lease->Commit(StateOf(64, next), false).ok()) last = next;
        } else {
          last = 0;  // Evicted: start again.
        }
        auto shared = store.Acquire(Ask("shared", step % 7 == 0));
        if (shared.ok()) (void)shared->Commit(StateOf(64, 1), false);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(kThreads, 0));
  const auto stats = store.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_LE(stats[0].active, 5);
  EXPECT_EQ(stats[0].state_bytes, stats[0].active * 64);
}

}  // namespace
}  // namespace precompile::server
