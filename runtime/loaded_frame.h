// A frame of a loaded version as its manifest entry describes it: its
// variants loaded with their guards compiled, its eager program, and the
// counters its calls keep. LoadFrame builds one at load; afterwards only the
// counters change, so calls on any thread read it without a lock.
// Internal to the loaded_version library (runtime/loaded_version.cc
// dispatches calls over these).
#ifndef PRECOMPILE_RUNTIME_LOADED_FRAME_H_
#define PRECOMPILE_RUNTIME_LOADED_FRAME_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "proto/artifact.pb.h"
#include "runtime/artifact_reader.h"
#include "runtime/eager_program.h"
#include "runtime/frame_dispatcher.h"
#include "runtime/loaded_version.h"
#include "runtime/python_program.h"
#include "runtime/variant.h"

namespace precompile {

struct LoadedFrame {
  const artifact::v1::Frame* proto = nullptr;
  // Its place in the manifest's frames.
  int index = 0;
  std::vector<std::string> parameter_names;
  std::unique_ptr<FrameDispatcher> dispatcher;
  std::vector<std::unique_ptr<Variant>> variants;
  // Null when the frame is not flagged eager_fallback.
  std::unique_ptr<EagerProgram> eager;
  // Indices of the tensor leaves among the values a variant or the eager
  // program returns: the frame's outputs.
  std::vector<int> tensor_leaves;
  std::atomic<bool> warned{false};
  // Calls by Outcome, and hits per variant.
  std::array<std::atomic<uint64_t>, 4> calls{};
  std::unique_ptr<std::atomic<uint64_t>[]> hits;
  // Per variant, per size symbol: the parameter and dimension that bind it
  // in its guards (the dimension is the symbol plus `offset`), for the size
  // of its outputs before it runs.
  struct SymbolSource {
    int parameter;
    int dim;
    int64_t offset;
  };
  std::vector<absl::flat_hash_map<uint32_t, SymbolSource>> symbol_sources;
};

// Loads `proto`, the frame at `index` of `artifact`'s manifest, for `device`:
// compiles its variants' guards, loads their packages and its eager program
// (TorchScript, or Python as `options` allow). Errors name the frame where
// the part failing does not (guards), or are the part's own (packages,
// programs: see Variant::Load, LoadTorchScriptProgram, LoadPythonProgram).
absl::StatusOr<std::unique_ptr<LoadedFrame>> LoadFrame(const Artifact& artifact,
                                                       const artifact::v1::Frame& proto,
                                                       int index, DeviceType device,
                                                       const LoadOptions& options);

// What `options` allow of Python: its programs, and the operators defined in
// Python that compiled code calls (runtime/operators.h).
PythonSettings PythonSettingsOf(const LoadOptions& options);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_LOADED_FRAME_H_
