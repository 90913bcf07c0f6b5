#include "client/load_tool.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/inference_client.h"
#include "base/json_text.h"
#include "client/load_generator.h"
#include "client/misses.h"
#include "client/request_mix.h"
#include "client/tool_flags.h"

namespace precompile::client {
namespace {

struct Options {
  ConnectionFlags connection;
  std::string mix;
  std::vector<int> concurrency;
  double rate = 0;
  std::string misses;
  std::string arrivals = "poisson";
  int max_outstanding = 256;
  double warmup = 0;
  double duration = 0;
  int64_t requests = 0;
  std::string json_out;
  int64_t seed = 1;
  int async_threads = 2;
  bool allow_remote = false;
  bool quiet = false;
};

void AddFlags(CLI::App& app, Options* o) {
  app.description(
      "usage: precompile_load (--mix=FILE | --misses=FILE) [--concurrency=1,8,64 | --rate=500]\n"
      "       [FLAGS]\n"
      "\n"
      "Sends KServe v2 ModelInfer requests drawn from a weighted mix to one precompile-serve\n"
      "server and reports throughput, latency percentiles and counts by status code and\n"
      "outcome (variant, eager_fallback, or the error). Closed loop: one phase per\n"
      "concurrency level. Open loop: requests at --rate per second. Each phase runs\n"
      "--warmup seconds unrecorded, then --duration seconds or --requests requests.\n"
      "Only loopback addresses unless --allow_remote.");
  app.footer(
      "\n"
      "mix file:\n"
      "  [{\"name\": \"hit\", \"weight\": 8, \"model\": \"mlp\",\n"
      "    \"inputs\": {\"x\": {\"shape\": [8, 4], \"datatype\": \"FP32\", \"fill\": "
      "\"random\"}},\n"
      "    \"params\": {}},\n"
      "   {\"name\": \"eager\", \"weight\": 1, \"model\": \"loop\",\n"
      "    \"inputs\": {\"x\": {\"shape\": [8, 4], \"fill\": \"random\"}}, \"params\": {\"n\": "
      "1}},\n"
      "   {\"name\": \"refused\", \"weight\": 1, \"model\": \"mlp\",\n"
      "    \"inputs\": {\"x\": {\"shape\": [1, 4], \"fill\": \"random\"}}}]\n"
      "\n"
      "misses file: the JSON of 'precompile_client --json misses MODEL'. Each call of the\n"
      "entry frame that no variant matched becomes a template weighted by its count:\n"
      "floating-point tensors random, integer and bool tensors zeros, scalars as recorded.\n"
      "\n"
      "exit status: 0 the run completed (whatever the server answered); 1 the report could\n"
      "not be written; 2 usage error or a non-loopback address without --allow_remote.");
  CLI::Option* mix = app.add_option("--mix", o->mix, "JSON file of weighted request templates");
  CLI::Option* misses = app.add_option(
      "--misses", o->misses, "replay a misses file (precompile_client --json misses) as traffic");
  mix->excludes(misses);
  misses->excludes(mix);
  CLI::Option* concurrency =
      app.add_option("--concurrency", o->concurrency,
                     "closed loop: comma-separated concurrency levels, one phase each "
                     "(default: 1)")
          ->delimiter(',')
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->allow_extra_args(false)
          ->default_str("")
          ->check(CLI::Range(1, 10000));
  app.add_option("--rate", o->rate,
                 "open loop: target requests per second (instead of --concurrency)")
      ->check(NumberAbove(0, /*exclusive=*/false))
      ->excludes(concurrency);
  app.add_option("--arrivals", o->arrivals, "open loop: poisson or constant")
      ->check(CLI::IsMember({"poisson", "constant"}));
  app.add_option("--max_outstanding", o->max_outstanding,
                 "open loop: most requests in flight; arrivals beyond are skipped and counted")
      ->check(NumberAbove(1, /*exclusive=*/false));
  app.add_option("--warmup", o->warmup, "seconds not recorded at the start of each phase")
      ->check(NumberAbove(0, /*exclusive=*/false));
  CLI::Option* duration =
      app.add_option("--duration", o->duration,
                     "seconds recorded per phase (10 when neither --duration nor --requests is "
                     "given)")
          ->check(NumberAbove(0, /*exclusive=*/false));
  app.add_option("--requests", o->requests, "requests recorded per phase (instead of --duration)")
      ->check(NumberAbove(0, /*exclusive=*/false))
      ->excludes(duration);
  app.add_option("--json_out", o->json_out, "also write the report as JSON to this file");
  app.add_option("--seed", o->seed, "seed of random fills, template choice and Poisson arrivals");
  app.add_option("--async_threads", o->async_threads, "client threads completing calls")
      ->check(CLI::Range(1, 64));
  app.add_flag("--allow_remote", o->allow_remote,
               "allow an address outside 127.0.0.0/8, ::1 and localhost");
  app.add_flag("--quiet", o->quiet, "no progress lines on stderr");
  // Retries would hide UNAVAILABLE from the counts: one attempt by default.
  o->connection.max_attempts = 1;
  o->connection.timeout_seconds = 10;
  AddConnectionFlags(app, &o->connection);
}

absl::Status Parse(CLI::App& app, Options* options, const std::vector<std::string>& args,
                   bool* help) {
  return ParseCommandLine(
      app, [options](CLI::App& built) { AddFlags(built, options); }, args, help);
}

absl::StatusOr<std::vector<RequestTemplate>> ReadMissesMix(const std::string& path,
                                                           uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the misses file ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<precompile::v1::MissesResponse> misses = ParseMisses(contents.str());
  absl::StatusOr<std::vector<RequestTemplate>> mix =
      misses.ok() ? MissesRequestMix(*misses, seed)
                  : absl::StatusOr<std::vector<RequestTemplate>>(misses.status());
  if (!mix.ok()) {
    return absl::Status(mix.status().code(), absl::StrCat(path, ": ", mix.status().message()));
  }
  return mix;
}

int Usage(std::ostream& err, absl::string_view message) {
  err << "precompile_load: " << message << "\n"
      << "Run 'precompile_load --help' for usage.\n";
  return 2;
}

}  // namespace

std::string LoadToolUsage() {
  Options defaults;
  return ToolUsage("precompile_load", [&defaults](CLI::App& app) { AddFlags(app, &defaults); });
}

int RunLoadTool(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options o;
  CLI::App app("", "precompile_load");
  bool help = false;
  if (absl::Status parsed = Parse(app, &o, args, &help); !parsed.ok()) {
    return Usage(err, parsed.message());
  }
  if (help) {
    out << app.help();
    return 0;
  }
  if (!o.allow_remote && !IsLoopbackTarget(o.connection.address)) {
    return Usage(err, absl::StrCat("refusing to send load to ", o.connection.address,
                                   ": not a loopback address (127.0.0.0/8, [::1], localhost); "
                                   "pass --allow_remote if you mean it"));
  }

  LoadOptions load;
  load.rate = o.rate;
  if (!o.concurrency.empty()) load.concurrency = o.concurrency;
  load.arrivals = o.arrivals == "constant" ? Arrivals::kConstant : Arrivals::kPoisson;
  load.max_outstanding = o.max_outstanding;
  load.warmup = absl::Seconds(o.warmup);
  load.duration = absl::Seconds(o.duration > 0 ? o.duration : 10);
  load.requests = o.requests;
  load.seed = static_cast<uint64_t>(o.seed);
  if (!o.quiet) load.progress = &err;

  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(o.connection);
  if (!client_options.ok()) return Usage(err, client_options.status().message());
  load.timeout = client_options->timeout;
  load.max_attempts = client_options->retry.max_attempts;
  client_options->async_threads = o.async_threads;

  if (o.mix.empty() == o.misses.empty()) return Usage(err, "give --mix or --misses");
  absl::StatusOr<std::vector<RequestTemplate>> mix =
      o.mix.empty() ? ReadMissesMix(o.misses, load.seed) : ReadRequestMix(o.mix, load.seed);
  if (!mix.ok()) return Usage(err, mix.status().message());
  absl::StatusOr<std::unique_ptr<InferenceClient>> client =
      InferenceClient::Create(*client_options);
  if (!client.ok()) return Usage(err, client.status().message());

  LoadGenerator generator(**client, *std::move(mix), load);
  absl::StatusOr<LoadReport> report = generator.Run();
  if (!report.ok()) return Usage(err, report.status().message());
  PrintLoadReport(*report, out);
  if (!o.json_out.empty()) {
    std::ofstream file(o.json_out, std::ios::trunc);
    file << DumpJson(LoadReportJson(*report)) << "\n";
    file.close();
    if (!file) {
      err << "precompile_load: cannot write " << o.json_out << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace precompile::client
