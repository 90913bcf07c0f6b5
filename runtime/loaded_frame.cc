#include "runtime/loaded_frame.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/guard_program.h"
#include "runtime/python_program.h"
#include "runtime/torchscript_program.h"

namespace precompile {

absl::StatusOr<std::unique_ptr<LoadedFrame>> LoadFrame(const Artifact& artifact,
                                                       const artifact::v1::Frame& proto,
                                                       int index, DeviceType device,
                                                       const LoadOptions& options) {
  auto frame = std::make_unique<LoadedFrame>();
  frame->proto = &proto;
  frame->index = index;
  for (const auto& p : proto.parameters()) frame->parameter_names.push_back(p.name());
  for (int i = 0; i < proto.outputs().leaves_size(); ++i) {
    if (proto.outputs().leaves(i).is_tensor()) frame->tensor_leaves.push_back(i);
  }
  std::vector<GuardProgram> programs;
  VariantOptions variant_options;
  variant_options.device = device;
  variant_options.device_index = options.cuda_device_index;
  variant_options.num_runners = std::max(1, options.runners_per_variant);
  for (const auto& v : proto.variants()) {
    absl::StatusOr<GuardProgram> program = GuardProgram::Compile(v, frame->parameter_names);
    if (!program.ok()) {
      return absl::Status(program.status().code(), absl::StrCat("frame '", proto.name(), "': ",
                                                                program.status().message()));
    }
    programs.push_back(*std::move(program));
    auto& sources = frame->symbol_sources.emplace_back();
    for (const auto& guard : v.guards()) {
      if (!guard.has_tensor()) continue;
      for (int d = 0; d < guard.tensor().dims_size(); ++d) {
        const artifact::v1::DimGuard& dim = guard.tensor().dims(d);
        if (dim.has_symbol()) {
          sources.emplace(dim.symbol(), LoadedFrame::SymbolSource{
                                            static_cast<int>(guard.parameter()), d,
                                            dim.symbol_offset()});
        }
      }
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Variant> variant,
                     Variant::Load(v.id(), artifact.PathOf(v.package_path()), variant_options));
    frame->variants.push_back(std::move(variant));
  }
  frame->dispatcher = std::make_unique<FrameDispatcher>(std::move(programs));
  frame->hits = std::make_unique<std::atomic<uint64_t>[]>(proto.variants_size());
  for (int i = 0; i < proto.variants_size(); ++i) frame->hits[i] = 0;
  if (!proto.eager_program_path().empty()) {
    ASSIGN_OR_RETURN(frame->eager,
                     LoadTorchScriptProgram(proto.name(),
                                            artifact.PathOf(proto.eager_program_path()), device));
  } else if (proto.has_python_program()) {
    ASSIGN_OR_RETURN(
        frame->eager,
        LoadPythonProgram(proto.name(), artifact.PathOf(proto.python_program().path()), device,
                          artifact.manifest.python(), PythonSettingsOf(options)));
  }
  return frame;
}

PythonSettings PythonSettingsOf(const LoadOptions& options) {
  return {options.allow_python_programs, options.python_environment, options.python_plugin,
          options.python_path};
}

}  // namespace precompile
