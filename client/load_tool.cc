#include "client/load_tool.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/flags.h"
#include "client/inference_client.h"
#include "client/json_text.h"
#include "client/load_generator.h"
#include "client/request_mix.h"

namespace precompile::client {
namespace {

struct Options {
  ConnectionFlags connection;
  std::string mix;
  std::string concurrency;
  double rate = 0;
  std::string arrivals = "poisson";
  int64_t max_outstanding = 256;
  double warmup = 0;
  double duration = 0;
  int64_t requests = 0;
  std::string json_out;
  int64_t seed = 1;
  int64_t async_threads = 2;
  bool allow_remote = false;
  bool quiet = false;
  bool help = false;
};

void AddFlags(FlagParser& parser, Options* o) {
  parser.String("mix", &o->mix, "JSON file of weighted request templates (required)");
  parser.String("concurrency", &o->concurrency,
                "closed loop: comma-separated concurrency levels, one phase each (default: 1)");
  parser.Double("rate", &o->rate,
                "open loop: target requests per second (instead of "
                "--concurrency)");
  parser.String("arrivals", &o->arrivals, "open loop: poisson or constant");
  parser.Int("max_outstanding", &o->max_outstanding,
             "open loop: most requests in flight; arrivals beyond are skipped and counted");
  parser.Double("warmup", &o->warmup, "seconds not recorded at the start of each phase");
  parser.Double("duration", &o->duration,
                "seconds recorded per phase (10 when neither --duration nor --requests is given)");
  parser.Int("requests", &o->requests, "requests recorded per phase (instead of --duration)");
  parser.String("json_out", &o->json_out, "also write the report as JSON to this file");
  parser.Int("seed", &o->seed, "seed of random fills, template choice and Poisson arrivals");
  parser.Int("async_threads", &o->async_threads, "client threads completing calls");
  parser.Bool("allow_remote", &o->allow_remote,
              "allow an address outside 127.0.0.0/8, ::1 and localhost");
  parser.Bool("quiet", &o->quiet, "no progress lines on stderr");
  parser.Bool("help", &o->help, "print this help");
  // Retries would hide UNAVAILABLE from the counts: one attempt by default.
  o->connection.max_attempts = 1;
  o->connection.timeout_seconds = 10;
  AddConnectionFlags(parser, &o->connection);
}

int Usage(std::ostream& err, absl::string_view message) {
  err << "precompile_load: " << message << "\n"
      << "Run 'precompile_load --help' for usage.\n";
  return 2;
}

}  // namespace

std::string LoadToolUsage() {
  Options defaults;
  FlagParser parser;
  AddFlags(parser, &defaults);
  return absl::StrCat(
      "usage: precompile_load --mix=FILE [--concurrency=1,8,64 | --rate=500] [FLAGS]\n"
      "\n"
      "Sends KServe v2 ModelInfer requests drawn from a weighted mix to one precompile-serve\n"
      "server and reports throughput, latency percentiles and counts by status code and\n"
      "outcome (variant, eager_fallback, or the error). Closed loop: one phase per\n"
      "concurrency level. Open loop: requests at --rate per second. Each phase runs\n"
      "--warmup seconds unrecorded, then --duration seconds or --requests requests.\n"
      "Only loopback addresses unless --allow_remote.\n"
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
      "flags:\n",
      parser.Help(),
      "\n"
      "exit status: 0 the run completed (whatever the server answered); 1 the report could\n"
      "not be written; 2 usage error or a non-loopback address without --allow_remote.\n");
}

int RunLoadTool(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Options o;
  FlagParser parser;
  AddFlags(parser, &o);
  std::vector<std::string> positional;
  if (absl::Status parsed = parser.Parse(args, &positional); !parsed.ok()) {
    return Usage(err, parsed.message());
  }
  if (o.help) {
    out << LoadToolUsage();
    return 0;
  }
  if (!positional.empty()) {
    return Usage(err, absl::StrCat("unexpected argument '", positional[0], "'"));
  }
  if (!o.allow_remote && !IsLoopbackTarget(o.connection.address)) {
    return Usage(err, absl::StrCat("refusing to send load to ", o.connection.address,
                                   ": not a loopback address (127.0.0.0/8, [::1], localhost); "
                                   "pass --allow_remote if you mean it"));
  }
  if (o.mix.empty()) return Usage(err, "--mix is required");

  LoadOptions load;
  if (o.rate < 0) return Usage(err, "--rate must be > 0");
  if (o.rate > 0 && !o.concurrency.empty()) {
    return Usage(err, "--rate (open loop) and --concurrency (closed loop) exclude each other");
  }
  load.rate = o.rate;
  if (!o.concurrency.empty()) {
    load.concurrency.clear();
    for (absl::string_view level : absl::StrSplit(o.concurrency, ',')) {
      int c;
      if (!absl::SimpleAtoi(level, &c) || c < 1 || c > 10000) {
        return Usage(err, absl::StrCat("--concurrency=", o.concurrency,
                                       ": expected levels from 1 to 10000, comma-separated"));
      }
      load.concurrency.push_back(c);
    }
  }
  if (o.arrivals == "poisson") {
    load.arrivals = Arrivals::kPoisson;
  } else if (o.arrivals == "constant") {
    load.arrivals = Arrivals::kConstant;
  } else {
    return Usage(err, "--arrivals is poisson or constant");
  }
  if (o.max_outstanding < 1) return Usage(err, "--max_outstanding must be >= 1");
  load.max_outstanding = static_cast<int>(o.max_outstanding);
  if (o.warmup < 0) return Usage(err, "--warmup must be >= 0");
  load.warmup = absl::Seconds(o.warmup);
  if (o.duration < 0 || o.requests < 0) return Usage(err, "--duration and --requests are >= 0");
  if (o.duration > 0 && o.requests > 0) {
    return Usage(err, "--duration and --requests exclude each other");
  }
  load.duration = absl::Seconds(o.duration > 0 ? o.duration : 10);
  load.requests = o.requests;
  load.seed = static_cast<uint64_t>(o.seed);
  if (!o.quiet) load.progress = &err;

  absl::StatusOr<ClientOptions> client_options = ClientOptionsFromFlags(o.connection);
  if (!client_options.ok()) return Usage(err, client_options.status().message());
  load.timeout = client_options->timeout;
  load.max_attempts = client_options->retry.max_attempts;
  if (o.async_threads < 1 || o.async_threads > 64) {
    return Usage(err, "--async_threads must be from 1 to 64");
  }
  client_options->async_threads = static_cast<int>(o.async_threads);

  absl::StatusOr<std::vector<RequestTemplate>> mix = ReadRequestMix(o.mix, load.seed);
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
