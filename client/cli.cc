#include "client/cli.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/json_text.h"
#include "base/proto_json.h"
#include "client/admin_client.h"
#include "client/infer_request.h"
#include "client/inference_client.h"
#include "client/misses.h"
#include "client/npy.h"
#include "client/table.h"
#include "client/tensor.h"
#include "client/tensor_json.h"
#include "client/tool_flags.h"

namespace precompile::client {
namespace {

struct Options {
  ConnectionFlags connection;
  bool json = false;
  std::string model;
  std::vector<std::string> inputs;
  std::vector<std::string> params;
  std::vector<std::string> outputs;
  std::string output_dir;
  std::string model_version;
  std::string id;
  int64_t max_values = 16;
};

struct Command {
  const char* name;
  // "MODEL" (required), "[MODEL]" (optional) or "" (none).
  const char* model;
  const char* help;
};

constexpr Command kCommands[] = {
    {"infer", "MODEL", "run one inference call (see --input, --param, --output_dir)"},
    {"metadata", "MODEL", "the model's inputs and outputs (KServe ModelMetadata)"},
    {"config", "MODEL", "the model's configuration (Triton ModelConfig)"},
    {"summary", "MODEL", "the artifact's precompile summary [admin]"},
    {"frames", "MODEL", "the artifact's FRAMES list [admin]"},
    {"coverage", "MODEL", "calls per frame and outcome since the model loaded [admin]"},
    {"warnings", "MODEL", "eager-fallback warnings since the model loaded [admin]"},
    {"misses", "MODEL",
     "distinct calls per frame that no variant matched (--json: the file "
     "'precompile_capture --recapture' reads) [admin]"},
    {"models", "", "the repository's models and their state [admin]"},
    {"load", "MODEL", "load (or reload) a model from the repository [admin]"},
    {"unload", "MODEL", "unload a model [admin]"},
    {"rescan", "", "load new models and versions, unload removed ones [admin]"},
    {"health", "[MODEL]",
     "liveness, readiness and grpc.health status of the server or a model "
     "(exit 1 unless SERVING)"},
};

constexpr char kInferInputs[] =
    "infer inputs:\n"
    "  --input x=x.npy                              a .npy file (C order, little-endian)\n"
    "  --input 'x={\"shape\":[2,4],\"datatype\":\"FP32\",\"data\":[...]}'   inline values\n"
    "  --input 'x={\"shape\":[8,4],\"fill\":\"random\"}'   zeros, ones, random or a number\n"
    "      (without \"datatype\": the model's metadata says it, else FP32)\n"
    "  --param n=3   --param scale=0.5   --param check=true   --param name='\"007\"'\n";

// The tool's command line, writing into `o`, which must outlive the app.
void AddFlags(CLI::App& app, Options* o) {
  app.description(
      "Calls a precompile-serve server: KServe v2 inference and the precompile admin API.\n"
      "[admin] commands send the admin token when --admin_token_file is given.\n"
      "The flags below go before or after the command; a command's own flags are in\n"
      "'precompile_client COMMAND --help'.");
  app.footer(absl::StrCat(
      kInferInputs,
      "\n"
      "exit status: 0 success; 1 the server returned an error (its status code and message\n"
      "are printed), health is not SERVING, or an output could not be saved; 2 usage error."));
  AddConnectionFlags(app, &o->connection);
  app.add_flag("--json", o->json, "print JSON (stable keys) instead of text");
  app.require_subcommand(0, 1);
  for (const Command& c : kCommands) {
    CLI::App* command = app.add_subcommand(c.name, c.help);
    command->footer(absl::StrCat(absl::string_view(c.name) == "infer" ? kInferInputs : "",
                                 "\nThe connection flags and --json: precompile_client --help."));
    if (absl::string_view(c.model) == "MODEL") {
      command->add_option("MODEL", o->model, "the model")->required();
    } else if (absl::string_view(c.model) == "[MODEL]") {
      command->add_option("MODEL", o->model, "the model (default: the server)");
    }
  }
  for (const char* name : {"infer", "metadata", "config", "misses"}) {
    app.get_subcommand(name)->add_option("--model_version", o->model_version,
                                         "the version to call (default: the served one)");
  }
  CLI::App* infer = app.get_subcommand("infer");
  // Repeatable, one value per use, so that "--input x=x.npy mlp" leaves the
  // model alone.
  auto repeated = [](CLI::Option* option) {
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false)
        ->default_str("");
  };
  repeated(infer->add_option("--input", o->inputs,
                             "a tensor argument, NAME=FILE.npy or NAME={JSON spec} (repeatable)"));
  repeated(infer->add_option("--param", o->params,
                             "a non-tensor argument NAME=VALUE: true/false, an int, a float, or a "
                             "string (\"quoted\" to keep digits a string) (repeatable)"));
  repeated(infer->add_option("--output", o->outputs,
                             "return only this output, e.g. output0 (repeatable)"));
  infer->add_option("--output_dir", o->output_dir, "save each output as DIR/<output>.npy");
  infer->add_option("--id", o->id, "request id, echoed in the response");
  infer->add_option("--max_values", o->max_values, "values printed per output as text (0: all)")
      ->check(NumberAbove(0, /*exclusive=*/false));
}

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string ValuesText(const Tensor& tensor, int64_t max_values) {
  const int64_t count = ElementCount(tensor.shape).value_or(0);
  const int64_t shown = max_values <= 0 ? count : std::min(count, max_values);
  std::vector<std::string> values;
  for (int64_t i = 0; i < shown; ++i) values.push_back(FormatElement(tensor, i));
  if (shown < count) values.push_back("...");
  std::string text = absl::StrCat("[", absl::StrJoin(values, ", "), "]");
  if (shown < count) absl::StrAppend(&text, "  (", count, " values, first ", shown, " shown)");
  return text;
}

std::string ModelStateName(precompile::v1::ModelStatus::State state) {
  return precompile::v1::ModelStatus::State_Name(state);
}

class Cli {
 public:
  Cli(const Options& options, std::ostream& out, std::ostream& err)
      : options_(options), out_(out), err_(err) {}

  int Run(const std::string& command) {
    absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(options_.connection);
    if (!client_options.ok()) return Usage(client_options.status().message());
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateChannel(*client_options);
    if (!channel.ok()) return Usage(channel.status().message());
    inference_ = *InferenceClient::Create(*client_options, *channel);
    admin_ = *AdminClient::Create(*client_options, *channel);

    const std::string& model = options_.model;
    if (command == "infer") return Infer(model);
    if (command == "metadata") return Metadata(model);
    if (command == "config") return Config(model);
    if (command == "summary") return Summary(model);
    if (command == "frames") return Frames(model);
    if (command == "coverage") return Coverage(model);
    if (command == "warnings") return Warnings(model);
    if (command == "misses") return Misses(model);
    if (command == "models") return Models();
    if (command == "load") return Load(model);
    if (command == "unload") return Unload(model);
    if (command == "rescan") return Rescan();
    return Health(model);
  }

  int Usage(absl::string_view message) {
    err_ << "precompile_client: " << message << "\n"
         << "Run 'precompile_client --help' for usage.\n";
    return kExitUsage;
  }

 private:
  int Failed(const absl::Status& status) {
    const std::string code = absl::StatusCodeToString(status.code());
    err_ << "error: " << code << ": " << status.message() << "\n";
    if (options_.json) {
      Json error = Json::object();
      error["code"] = code;
      error["message"] = std::string(status.message());
      Json json = Json::object();
      json["error"] = std::move(error);
      out_ << DumpJson(json) << "\n";
    }
    return kExitFailed;
  }

  int PrintJson(const Json& json) {
    out_ << DumpJson(json) << "\n";
    return kExitOk;
  }

  // The datatype of each input the model's metadata lists, for an inline
  // spec that names none (a token model's INT64 ids); empty when the server
  // does not say, and such a spec is FP32.
  std::map<std::string, std::string> InputDatatypes(const std::string& model) {
    std::map<std::string, std::string> datatypes;
    auto metadata = inference_->ModelMetadata(model, options_.model_version);
    if (!metadata.ok()) return datatypes;
    for (const auto& input : metadata->inputs()) datatypes[input.name()] = input.datatype();
    return datatypes;
  }

  int Infer(const std::string& model) {
    std::vector<Tensor> inputs;
    std::mt19937_64 rng(0);
    std::optional<std::map<std::string, std::string>> datatypes;
    for (const std::string& spec : options_.inputs) {
      const size_t equals = spec.find('=');
      if (equals == 0 || equals == std::string::npos) {
        return Usage(absl::StrCat("--input ", spec, ": expected NAME=FILE.npy or NAME={JSON}"));
      }
      const std::string name = spec.substr(0, equals);
      const std::string value = spec.substr(equals + 1);
      absl::StatusOr<Tensor> tensor;
      if (!value.empty() && value[0] == '{') {
        absl::StatusOr<Json> json = ParseJson(value);
        if (!json.ok()) {
          return Usage(absl::StrCat("--input ", name, ": ", json.status().message()));
        }
        if (json->is_object() && !json->contains("datatype") && !json->contains("npy")) {
          if (!datatypes) datatypes = InputDatatypes(model);
          if (auto it = datatypes->find(name); it != datatypes->end()) {
            (*json)["datatype"] = it->second;
          }
        }
        tensor = TensorFromJson(name, *json, rng);
      } else {
        tensor = ReadNpy(value);
        if (tensor.ok()) tensor->name = name;
      }
      if (!tensor.ok()) return Usage(tensor.status().message());
      inputs.push_back(*std::move(tensor));
    }
    std::map<std::string, ScalarValue> scalars;
    for (const std::string& param : options_.params) {
      const size_t equals = param.find('=');
      if (equals == 0 || equals == std::string::npos) {
        return Usage(absl::StrCat("--param ", param, ": expected NAME=VALUE"));
      }
      scalars[param.substr(0, equals)] = ScalarFromText(param.substr(equals + 1));
    }
    InferRequestOptions request_options;
    request_options.model_version = options_.model_version;
    request_options.id = options_.id;
    request_options.outputs = options_.outputs;
    absl::StatusOr<inference::ModelInferRequest> request =
        MakeInferRequest(model, inputs, scalars, request_options);
    if (!request.ok()) return Usage(request.status().message());

    absl::StatusOr<inference::ModelInferResponse> response = inference_->Infer(*request);
    if (!response.ok()) return Failed(response.status());
    absl::StatusOr<InferResult> result = ReadInferResponse(*response);
    if (!result.ok()) return Failed(result.status());

    std::vector<std::string> files(result->outputs.size());
    if (!options_.output_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(options_.output_dir, error);
      if (error) {
        return Failed(absl::InternalError(
            absl::StrCat("cannot create ", options_.output_dir, ": ", error.message())));
      }
      for (size_t i = 0; i < result->outputs.size(); ++i) {
        const Tensor& output = result->outputs[i];
        files[i] = (std::filesystem::path(options_.output_dir) / (output.name + ".npy")).string();
        if (absl::Status saved = WriteNpy(files[i], output); !saved.ok()) return Failed(saved);
      }
    }

    if (options_.json) {
      Json json = Json::object();
      json["model_name"] = result->model_name;
      json["model_version"] = result->model_version;
      json["id"] = result->id;
      json["outcome"] = result->outcome;
      json["variant"] = result->variant;
      Json outputs = Json::array();
      for (size_t i = 0; i < result->outputs.size(); ++i) {
        const Tensor& output = result->outputs[i];
        Json o = Json::object();
        o["name"] = output.name;
        o["datatype"] = output.datatype;
        Json shape = Json::array();
        for (int64_t d : output.shape) shape.push_back(d);
        o["shape"] = std::move(shape);
        o["data"] = TensorValuesJson(output);
        o["file"] = files[i].empty() ? Json() : Json(files[i]);
        outputs.push_back(std::move(o));
      }
      json["outputs"] = std::move(outputs);
      return PrintJson(json);
    }
    out_ << "model:    " << result->model_name << " (version " << result->model_version << ")\n";
    if (!result->id.empty()) out_ << "id:       " << result->id << "\n";
    out_ << "outcome:  " << (result->outcome.empty() ? "(not reported)" : result->outcome);
    if (!result->variant.empty()) out_ << " (" << result->variant << ")";
    out_ << "\n";
    for (size_t i = 0; i < result->outputs.size(); ++i) {
      const Tensor& output = result->outputs[i];
      out_ << output.name << ": " << output.datatype << " " << FormatShape(output.shape) << "\n"
           << "  " << ValuesText(output, options_.max_values) << "\n";
      if (!files[i].empty()) out_ << "  saved to " << files[i] << "\n";
    }
    return kExitOk;
  }

  int Metadata(const std::string& model) {
    auto metadata = inference_->ModelMetadata(model, options_.model_version);
    if (!metadata.ok()) return Failed(metadata.status());
    if (options_.json) return PrintJson(ProtoToJson(*metadata));
    out_ << "model:     " << metadata->name() << "\n"
         << "versions:  " << absl::StrJoin(metadata->versions(), ", ") << "\n"
         << "platform:  " << metadata->platform() << "\n";
    for (const auto& [title, tensors] :
         {std::pair{"inputs:", &metadata->inputs()}, std::pair{"outputs:", &metadata->outputs()}}) {
      out_ << title << "\n";
      std::vector<std::vector<std::string>> rows;
      for (const auto& t : *tensors) {
        rows.push_back({"  " + t.name(), t.datatype(),
                        FormatShape(std::vector<int64_t>(t.shape().begin(), t.shape().end()))});
      }
      PrintTable(out_, rows);
    }
    return kExitOk;
  }

  int Config(const std::string& model) {
    auto response = inference_->ModelConfig(model, options_.model_version);
    if (!response.ok()) return Failed(response.status());
    if (options_.json) return PrintJson(ProtoToJson(*response));
    const inference::ModelConfig& config = response->config();
    auto type_name = [](inference::DataType t) {
      std::string name = inference::DataType_Name(t);
      return name.rfind("TYPE_", 0) == 0 ? name.substr(5) : name;
    };
    out_ << "name:            " << config.name() << "\n"
         << "platform:        " << config.platform() << "\n"
         << "backend:         " << config.backend() << "\n"
         << "max_batch_size:  " << config.max_batch_size() << "\n";
    out_ << "inputs:\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& t : config.input()) {
      rows.push_back({"  " + t.name(), type_name(t.data_type()),
                      FormatShape(std::vector<int64_t>(t.dims().begin(), t.dims().end()))});
    }
    PrintTable(out_, rows);
    out_ << "outputs:\n";
    rows.clear();
    for (const auto& t : config.output()) {
      rows.push_back({"  " + t.name(), type_name(t.data_type()),
                      FormatShape(std::vector<int64_t>(t.dims().begin(), t.dims().end()))});
    }
    PrintTable(out_, rows);
    for (const auto& group : config.instance_group()) {
      out_ << "instance group:  " << group.name() << " "
           << inference::ModelInstanceGroup::Kind_Name(group.kind()) << " x" << group.count()
           << "\n";
    }
    out_ << "parameters:\n";
    std::map<std::string, std::string> params;
    for (const auto& [key, value] : config.parameters()) params[key] = value.string_value();
    rows.clear();
    for (const auto& [key, value] : params) rows.push_back({"  " + key, value});
    PrintTable(out_, rows);
    return kExitOk;
  }

  int Summary(const std::string& model) {
    auto summary = admin_->GetSummary(model);
    if (!summary.ok()) return Failed(summary.status());
    if (options_.json) return PrintJson(ProtoToJson(*summary));
    std::vector<std::string> frames;
    for (const std::string& frame : summary->frames()) {
      auto it = summary->variants_per_frame().find(frame);
      const uint32_t n = it == summary->variants_per_frame().end() ? 0 : it->second;
      frames.push_back(absl::StrCat(frame, " (", n, n == 1 ? " variant)" : " variants)"));
    }
    auto list = [](const auto& items) {
      return items.empty() ? std::string("none") : absl::StrJoin(items, "; ");
    };
    out_ << "model:             " << summary->name() << " (version " << summary->version() << ")\n"
         << "entry frame:       " << summary->entry_frame() << "\n"
         << "complete:          " << YesNo(summary->complete()) << "\n"
         << "truncated:         " << YesNo(summary->truncated()) << "\n"
         << "frames:            " << list(frames) << "\n"
         << "eager fallbacks:   " << list(summary->eager_fallbacks()) << "\n"
         << "uncovered frames:  " << list(summary->uncovered_frames()) << "\n"
         << "captured with:     torch " << summary->torch_version() << ", device "
         << summary->device() << ", CPU ISA " << summary->cpu_isa() << "\n";
    return kExitOk;
  }

  int Frames(const std::string& model) {
    auto frames = admin_->GetFrames(model);
    if (!frames.ok()) return Failed(frames.status());
    if (options_.json) return PrintJson(ProtoToJson(*frames));
    out_ << frames->frames();
    if (!frames->frames().empty() && frames->frames().back() != '\n') out_ << "\n";
    return kExitOk;
  }

  int Coverage(const std::string& model) {
    auto coverage = admin_->GetCoverage(model);
    if (!coverage.ok()) return Failed(coverage.status());
    if (options_.json) return PrintJson(ProtoToJson(*coverage));
    out_ << coverage->name() << " (version " << coverage->version() << ")\n";
    std::vector<std::vector<std::string>> rows = {
        {"FRAME", "FLAGGED", "VARIANT", "EAGER", "REFUSED", "ERROR", "HITS"}};
    for (const auto& f : coverage->frames()) {
      std::map<std::string, uint64_t> hits(f.variant_hits().begin(), f.variant_hits().end());
      std::vector<std::string> hit_text;
      for (const auto& [id, n] : hits) hit_text.push_back(absl::StrCat(id, "=", n));
      rows.push_back({f.frame(), YesNo(f.eager_fallback()), absl::StrCat(f.variant_calls()),
                      absl::StrCat(f.eager_fallback_calls()), absl::StrCat(f.refused_calls()),
                      absl::StrCat(f.error_calls()), absl::StrJoin(hit_text, " ")});
    }
    PrintTable(out_, rows);
    return kExitOk;
  }

  int Warnings(const std::string& model) {
    auto warnings = admin_->ListWarnings(model);
    if (!warnings.ok()) return Failed(warnings.status());
    if (options_.json) return PrintJson(ProtoToJson(*warnings));
    if (warnings->warnings().empty()) out_ << "no eager-fallback warnings\n";
    for (const auto& w : warnings->warnings()) {
      const absl::Time time = absl::FromUnixMicros(static_cast<int64_t>(w.time() * 1e6));
      out_ << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", time, absl::UTCTimeZone()) << "  " << w.frame()
           << "\n  " << w.message() << "\n";
    }
    return kExitOk;
  }

  int Misses(const std::string& model) {
    int64_t version = 0;
    if (!options_.model_version.empty() &&
        (!absl::SimpleAtoi(options_.model_version, &version) || version < 1)) {
      return Usage(absl::StrCat("--model_version ", options_.model_version,
                                " is not a version number"));
    }
    auto misses = admin_->Misses(model, version);
    if (!misses.ok()) return Failed(misses.status());
    if (options_.json) return PrintJson(ProtoToJson(*misses));
    out_ << misses->name() << " (version " << misses->version() << ")\n";
    if (misses->frames().empty()) {
      out_ << "no misses: every call matched a variant\n";
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {
        {"FRAME", "SIGNATURE", "COUNT", "OUTCOME", "FAILING GUARD"}};
    for (const auto& f : misses->frames()) {
      for (const auto& m : f.signatures()) {
        rows.push_back({f.frame(), SignatureText(m.call()), absl::StrCat(m.count()),
                        m.outcome() == precompile::v1::EAGER_FALLBACK ? "eager_fallback" : "refused",
                        m.closest_variant().empty()
                            ? "(no variant)"
                            : absl::StrCat(m.closest_variant(), ": ", m.failing_guard())});
      }
      if (f.other_calls() > 0) {
        rows.push_back({f.frame(), "(other signatures, over the bound)",
                        absl::StrCat(f.other_calls()), "", ""});
      }
    }
    PrintTable(out_, rows);
    return kExitOk;
  }

  // "3,2" for a model serving versions 3 and 2; "-" for none.
  static std::string ServedVersions(const precompile::v1::ModelStatus& status) {
    if (status.versions_size() > 0) return absl::StrJoin(status.versions(), ",");
    return status.version() > 0 ? absl::StrCat(status.version()) : "-";
  }

  void PrintModels(const google::protobuf::RepeatedPtrField<precompile::v1::ModelStatus>& models) {
    std::vector<std::vector<std::string>> rows = {{"MODEL", "VERSIONS", "STATE", "REASON"}};
    for (const auto& m : models) {
      rows.push_back({m.name(), ServedVersions(m), ModelStateName(m.state()), m.reason()});
    }
    PrintTable(out_, rows);
  }

  int Models() {
    auto models = admin_->ListModels();
    if (!models.ok()) return Failed(models.status());
    if (options_.json) return PrintJson(ProtoToJson(*models));
    PrintModels(models->models());
    return kExitOk;
  }

  void PrintStatus(const precompile::v1::ModelStatus& status) {
    out_ << status.name() << ": " << ModelStateName(status.state());
    if (status.version() > 0) {
      out_ << " (version" << (status.versions_size() > 1 ? "s " : " ") << ServedVersions(status)
           << ")";
    }
    if (!status.reason().empty()) out_ << ": " << status.reason();
    out_ << "\n";
  }

  int Load(const std::string& model) {
    auto loaded = admin_->LoadModel(model);
    if (!loaded.ok()) return Failed(loaded.status());
    if (options_.json) return PrintJson(ProtoToJson(*loaded));
    PrintStatus(loaded->status());
    return kExitOk;
  }

  int Unload(const std::string& model) {
    auto unloaded = admin_->UnloadModel(model);
    if (!unloaded.ok()) return Failed(unloaded.status());
    if (options_.json) return PrintJson(ProtoToJson(*unloaded));
    PrintStatus(unloaded->status());
    return kExitOk;
  }

  int Rescan() {
    auto rescanned = admin_->Rescan();
    if (!rescanned.ok()) return Failed(rescanned.status());
    if (options_.json) return PrintJson(ProtoToJson(*rescanned));
    PrintModels(rescanned->models());
    return kExitOk;
  }

  int Health(const std::string& service) {
    absl::StatusOr<bool> live = inference_->ServerLive();
    if (!live.ok()) return Failed(live.status());
    absl::StatusOr<bool> ready = inference_->ServerReady();
    if (!ready.ok()) return Failed(ready.status());
    auto health = inference_->Health(service);
    if (!health.ok()) return Failed(health.status());
    const std::string status = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*health);
    if (options_.json) {
      Json json = Json::object();
      json["live"] = *live;
      json["ready"] = *ready;
      json["service"] = service;
      json["status"] = status;
      PrintJson(json);
    } else {
      out_ << "live:    " << YesNo(*live) << "\n"
           << "ready:   " << YesNo(*ready) << "\n"
           << "health:  " << status << (service.empty() ? "" : " (" + service + ")") << "\n";
    }
    return *health == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitFailed;
  }

  const Options& options_;
  std::ostream& out_;
  std::ostream& err_;
  std::unique_ptr<InferenceClient> inference_;
  std::unique_ptr<AdminClient> admin_;
};

// Builds the command line into `app` and parses `args`; see ParseCommandLine.
absl::Status Parse(CLI::App& app, Options* options, const std::vector<std::string>& args,
                   bool* help) {
  return ParseCommandLine(
      app, [options](CLI::App& built) { AddFlags(built, options); }, args, help);
}

}  // namespace

std::string CliUsage() {
  Options defaults;
  return ToolUsage("precompile_client", [&defaults](CLI::App& app) { AddFlags(app, &defaults); });
}

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options options;
  Cli cli(options, out, err);
  if (!args.empty() && args[0] == "help") {
    out << CliUsage();
    return kExitOk;
  }
  CLI::App app("", "precompile_client");
  bool help = false;
  if (absl::Status parsed = Parse(app, &options, args, &help); !parsed.ok()) {
    return cli.Usage(parsed.message());
  }
  if (help) {
    out << app.help();
    return kExitOk;
  }
  if (app.get_subcommands().empty()) return cli.Usage("no command given");
  return cli.Run(app.get_subcommands()[0]->get_name());
}

}  // namespace precompile::client
