#include "client/tool_flags.h"

#include <cmath>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/retry.h"

namespace precompile::client {
namespace {

// CLI11's layout, except that each subcommand shows its arguments.
class Formatter : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    std::string name = sub->get_name();
    for (const CLI::Option* argument :
         sub->get_options([](const CLI::Option* o) { return o->get_positional(); })) {
      absl::StrAppend(&name, " ", make_option_usage(argument));
    }
    // CLI11's column: the description starts at its width, or on a line of
    // its own below a name that reaches it.
    std::string line = absl::StrCat("  ", name);
    const size_t width = get_column_width();
    if (line.size() >= width) absl::StrAppend(&line, "\n");
    line.resize(line.size() >= width ? line.size() + width : width, ' ');
    return absl::StrCat(line, sub->get_description(), "\n");
  }
};

// "a", "a and b", "a, b and c".
std::string JoinNames(const std::vector<std::string>& names) {
  if (names.size() <= 1) return absl::StrJoin(names, "");
  return absl::StrCat(absl::StrJoin(names.begin(), names.end() - 1, ", "), " and ", names.back());
}

// The message for what no flag or argument took.
std::string LeftOver(const CLI::App& app, const std::string& arg) {
  const std::vector<const CLI::App*> commands =
      app.get_subcommands([](const CLI::App*) { return true; });
  if (arg.size() > 1 && arg[0] == '-') {
    const std::string flag = arg.substr(0, arg.find('='));
    std::vector<std::string> takers;
    for (const CLI::App* command : commands) {
      if (command->get_option_no_throw(flag) != nullptr) takers.push_back(command->get_name());
    }
    const std::vector<CLI::App*> chosen = app.get_subcommands();
    if (!chosen.empty() && chosen[0]->get_option_no_throw(flag) != nullptr) {
      return absl::StrCat(flag, " goes after the command ", chosen[0]->get_name());
    }
    if (!takers.empty()) return absl::StrCat(flag, " applies to ", JoinNames(takers), " only");
    return absl::StrCat("unknown flag ", flag);
  }
  if (!commands.empty() && app.get_subcommands().empty()) {
    return absl::StrCat("unknown command '", arg, "'");
  }
  return absl::StrCat("unexpected argument '", arg, "'");
}

// Flags that keep their last value when repeated and show their default in
// --help, and the layout of Formatter.
void ConfigureApp(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.option_defaults()->always_capture_default();
  app.formatter(std::make_shared<Formatter>());
  // Left over arguments come to ParseCommandLine, which names them better
  // than CLI11's "The following argument was not expected".
  app.allow_extras();
  // A subcommand's flags and the tool's may come in any order.
  app.fallthrough();
}

}  // namespace

CLI::Validator NumberAbove(double min, bool exclusive) {
  const std::string bound = absl::StrCat(exclusive ? "> " : ">= ", min);
  return CLI::Validator(
      [min, exclusive, bound](std::string& text) -> std::string {
        double value;
        if (!absl::SimpleAtod(text, &value) || !std::isfinite(value) ||
            (exclusive ? value <= min : value < min)) {
          return absl::StrCat("expected a number ", bound, ", got '", text, "'");
        }
        return "";
      },
      // No description: --help shows the flag's type and default, and its
      // help text says what it means.
      "");
}

void AddConnectionFlags(CLI::App& app, ConnectionFlags* flags) {
  app.add_option("--address", flags->address, "server address host:port");
  app.add_option("--timeout", flags->timeout_seconds,
                 "seconds each call may take, its retries included")
      ->check(NumberAbove(0, /*exclusive=*/true));
  app.add_option("--max_attempts", flags->max_attempts,
                 absl::StrCat("attempts per call when the server is UNAVAILABLE, from 1 (no retry) "
                              "to ",
                              kMaxAttempts))
      ->check(CLI::Range(1, kMaxAttempts));
  app.add_flag("--tls", flags->tls, "speak TLS, verifying the server with the default roots");
  app.add_option("--tls_ca", flags->tls_ca, "PEM root CA that signed the server's certificate");
  app.add_option("--tls_cert", flags->tls_cert, "PEM client certificate for mutual TLS");
  app.add_option("--tls_key", flags->tls_key, "PEM private key of --tls_cert");
  app.add_option("--tls_server_name", flags->tls_server_name,
                 "name to expect in the server's certificate (default: the address's host)");
  app.add_option("--admin_token_file", flags->admin_token_file,
                 "file holding the admin token (sent as 'authorization: Bearer <token>')");
}

absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const ConnectionFlags& flags) {
  ClientOptions options;
  if (flags.address.empty()) return absl::InvalidArgumentError("--address is empty");
  options.address = flags.address;
  options.timeout = absl::Seconds(flags.timeout_seconds);
  options.retry.max_attempts = flags.max_attempts;
  options.tls.enabled = flags.tls;
  options.tls.root_ca_file = flags.tls_ca;
  options.tls.client_cert_file = flags.tls_cert;
  options.tls.client_key_file = flags.tls_key;
  options.tls.server_name_override = flags.tls_server_name;
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!flags.admin_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(flags.admin_token_file);
    if (!token.ok()) return token.status();
    options.admin_token = *std::move(token);
  }
  return options;
}

absl::Status ParseCommandLine(CLI::App& app, const std::function<void(CLI::App&)>& add_flags,
                              const std::vector<std::string>& args, bool* help) {
  *help = false;
  try {
    ConfigureApp(app);
    add_flags(app);
  } catch (const CLI::Error& e) {
    return absl::InternalError(absl::StrCat("the command line is built wrong: ", e.what()));
  }
  // CLI11 takes the arguments last first.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    *help = true;
    return absl::OkStatus();
  } catch (const CLI::RequiredError& e) {
    // "MODEL is required": say whose.
    const std::vector<CLI::App*> command = app.get_subcommands();
    return absl::InvalidArgumentError(
        command.empty() ? e.what() : absl::StrCat(command[0]->get_name(), ": ", e.what()));
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  const std::vector<std::string> left_over = app.remaining(/*recurse=*/true);
  if (!left_over.empty()) return absl::InvalidArgumentError(LeftOver(app, left_over[0]));
  return absl::OkStatus();
}

std::string ToolUsage(const std::string& name, const std::function<void(CLI::App&)>& add_flags) {
  CLI::App app("", name);
  bool help = false;
  if (absl::Status built = ParseCommandLine(app, add_flags, {"--help"}, &help); !built.ok()) {
    return std::string(built.message());
  }
  return app.help();
}

}  // namespace precompile::client
