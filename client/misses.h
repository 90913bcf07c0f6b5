// The misses a server recorded (the admin RPC Misses), as people read them
// and as traffic: `precompile_client misses` prints them, and
// `precompile_load --misses` replays a saved misses file, so that the calls a
// version missed can be sent again to the next one.
#ifndef PRECOMPILE_CLIENT_MISSES_H_
#define PRECOMPILE_CLIENT_MISSES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/request_mix.h"
#include "proto/admin.pb.h"

namespace precompile::client {

// "x: float32[3, 4], n: 2": what the guards read of a call.
std::string SignatureText(const precompile::artifact::v1::CallSignature& call);

// A misses file: the JSON `precompile_client --json misses MODEL` prints.
// INVALID_ARGUMENT when it is not one.
absl::StatusOr<precompile::v1::MissesResponse> ParseMisses(absl::string_view json);

// One request template per signature of the entry frame, weighted by its
// count, for the model the misses name (its newest version: replayed misses
// should reach whatever version serves now). Floating-point tensors get
// random values, integer and bool tensors zeros (valid indices for any
// table), scalars their recorded values; None arguments are left out.
// INVALID_ARGUMENT when no entry-frame signature is recorded or one cannot
// be sent (a dtype or value the protocol does not carry).
absl::StatusOr<std::vector<RequestTemplate>> MissesRequestMix(
    const precompile::v1::MissesResponse& misses, uint64_t seed);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_MISSES_H_
