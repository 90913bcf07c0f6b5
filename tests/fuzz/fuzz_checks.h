// The checks behind the fuzz targets, shared by the libFuzzer entry points
// (request_decoding_fuzzer.cc, guard_fuzzer.cc, manifest_fuzzer.cc,
// http_request_fuzzer.cc, http2_ledger_fuzzer.cc, built by
// run_fuzzers.sh with clang) and by fuzz_regression_test.cc, which replays
// the committed corpus and every saved crash with the ordinary Bazel build.
//
// Each check takes arbitrary bytes, drives one input-facing component with
// them and returns OK unless an invariant of that component is violated: a
// malformed input that the component refuses with a status is fine. Memory
// errors are left to the sanitizers (ASan, UBSan) the fuzzers are built with.
//
// Thread safety: CheckRequestDecoding, CheckGuards and CheckHttpRequest have
// no shared state.
// CheckManifest writes into one fixture directory per process (see below):
// call it from one thread at a time.
#ifndef PRECOMPILE_TESTS_FUZZ_FUZZ_CHECKS_H_
#define PRECOMPILE_TESTS_FUZZ_FUZZ_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/artifact_reader.h"

namespace precompile::fuzz {

// Decodes every input of a request with server::DecodeInput. `data` is a
// serialized inference::ModelInferRequest or, when its first byte is 0 (never
// the first byte of a serialized message), a description from which the rest
// of the bytes build one (BuildRequest in fuzz_checks.cc, encode_request in
// make_seeds.py), drawing dimensions from values near 2^31, 2^32, 2^61, 2^62
// and 2^63 that mutating varints at random rarely reaches.
// For each input decoded, checks that its dtype and shape are the request's,
// that nbytes == product(shape) * element size (computed without overflow),
// that data is non-null when nbytes > 0, that [data, data + nbytes) lies
// inside the input's raw_input_contents or inside the decoding storage, that
// typed contents round-trip, and that the response (DescribeOutput,
// SerializeInferResponse) carries the same bytes back.
// Every refusal must be INVALID_ARGUMENT with a message. INTERNAL names the
// violated invariant.
absl::Status CheckRequestDecoding(const uint8_t* data, size_t size);

// The HTTP endpoint's decoders (server/http/http_codec.h) on arbitrary bytes.
// `data`'s first byte chooses: bit 0 set, the next two bytes (little-endian)
// are an Inference-Header-Content-Length, taken modulo the body's size plus
// one; the rest is an infer request body for DecodeInferRequest, and also a
// path for RouteOf. Checks that a route naming a model has a non-empty name
// without '/'; that a refusal is INVALID_ARGUMENT with a message; that a
// request accepted has one raw_input_contents per input, each of which
// server::DecodeInput takes with the bytes the shape and datatype need; and
// that EncodeInferResponse of those tensors as outputs, as JSON, decodes back
// (through DecodeInferRequest) to the same bytes, NaNs aside, and as binary
// carries them after its JSON header.
absl::Status CheckHttpRequest(const uint8_t* data, size_t size);

// `data` is a little-endian uint16 length L, L bytes of a serialized
// artifact::v1::Frame, then a call (encode_guard_call in make_seeds.py):
//   state: u8 flags (bit 0: grad enabled), u8 default dtype (mod 10)
//   per parameter of the frame: u8 kind (mod 6: None, tensor, bool, int,
//     float, string), then for a tensor u8 dtype (mod 10), u8 device (mod 2),
//     u8 rank (mod 9) and rank int64 sizes; a bool u8; an int int64; a float
//     float64; a string u8 length and its bytes.
// Missing bytes read as zero. Compiles every variant of the frame with
// GuardProgram::Compile against the frame's parameter names and evaluates the
// compiled ones on the call: Matches() must equal !ExplainMismatch(), a
// mismatch must name a check in range with a reason, and a FrameDispatcher of
// them must agree (Match() returns a variant that matches, or -1 only when
// none does, and then ExplainMiss() names the variant that got furthest).
// Each tensor's sizes live in an allocation of exactly `rank` elements, so a
// read past the rank is an ASan report. Frames with more than
// kMaxFuzzParameters parameters are skipped.
inline constexpr int kMaxFuzzParameters = 64;
absl::Status CheckGuards(const uint8_t* data, size_t size);

// The runtime's answer for a CheckGuards input: per variant of the frame, 1
// if its guards hold for the call, 0 if not, -1 if they do not compile.
// INVALID_ARGUMENT when the frame does not parse. For the differential test
// against the capture's Python evaluator (tests/guards).
absl::StatusOr<std::vector<int>> EvaluateGuards(const uint8_t* data, size_t size);

// The gRPC front's HTTP/2 ledger (server/grpc/http2_stream_ledger.h) on one
// connection's bytes. `data`: byte 0 sets max_open_streams (mod 17, 0: no
// limit), byte 1 resets_per_second (mod 9, 0: no limit), byte 2 bit 0 set:
// the client's bytes start without HTTP/2's preface (otherwise the check sends
// it first); then chunks: u8 c, u8 length, that many bytes. Bit 0 of c says
// who sent the chunk (0: the client, 1: the server); the clock moves by
// ((c >> 1) - 8) * 50 ms before it, back as well as forward. Checks, after
// every chunk: while the client is within the limits, at most
// max_open_streams streams are open and breach() is kNone; a refusal names
// its breach (INVALID_ARGUMENT for kNotHttp2, RESOURCE_EXHAUSTED otherwise)
// and stays; kStreams means one stream past the bound; the resets counted
// stay within the budget (twice the rate, plus the rate times the time the
// clock moved forward) and kResets comes only past the burst; last_opened()
// moves only to the chunk's time; and a second ledger fed the same chunks a
// byte at a time agrees on all of it.
absl::Status CheckHttp2Ledger(const uint8_t* data, size_t size);

// Writes `data` as MANIFEST.pb into the fixture artifact directory (created
// once per process, see ManifestFixtureFiles()) and calls ReadArtifact with
// FuzzReaderOptions(). Any status is fine; an accepted artifact must have
// listed only files that resolve inside the directory, FRAMES among them,
// and an entry frame that exists; then every variant's guards are compiled
// as the runtime would.
absl::Status CheckManifest(const uint8_t* data, size_t size);

// What CheckManifest calls ReadArtifact with on `data` (for tests that want
// the reader's own status, e.g. that the committed seeds are accepted).
absl::StatusOr<Artifact> ReadFuzzArtifact(const uint8_t* data, size_t size);

// The fixture artifact's files besides MANIFEST.pb: FRAMES and, for each of
// the frames "forward", "encoder" and "scale", frames/<frame>/0.pt2, 1.pt2
// and eager.pt. Each file's content is "fuzz fixture: <path>\n"; make_seeds.py
// computes the same digests. The directory also holds a subdirectory "dir"
// and two symbolic links: "inside" -> FRAMES, and "escape" -> a directory
// outside the artifact that holds a copy of FRAMES.
std::vector<std::string> ManifestFixtureFiles();

// The torch version and CPU ISA predicate the manifest check reads with:
// torch "2.11.0", and only the ISAs "", "DEFAULT" and "AVX2" are supported
// (fixed, so that results do not depend on the machine).
ArtifactReaderOptions FuzzReaderOptions();

// The body of a fuzz target's LLVMFuzzerTestOneInput: runs `check` on the
// input and, if it returns an error, prints it with the fuzzer's name and
// aborts, which libFuzzer reports as a crash. Silences protobuf's log first.
int RunFuzzCheck(absl::Status (*check)(const uint8_t*, size_t), const char* fuzzer,
                 const uint8_t* data, size_t size);

}  // namespace precompile::fuzz

#endif  // PRECOMPILE_TESTS_FUZZ_FUZZ_CHECKS_H_
