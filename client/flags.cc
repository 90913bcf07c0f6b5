#include "client/flags.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace precompile::client {

void FlagParser::String(const std::string& name, std::string* target, const std::string& help) {
  flags_.push_back({name, Kind::kString, target, help, *target});
}

void FlagParser::Bool(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, Kind::kBool, target, help, *target ? "true" : "false"});
}

void FlagParser::Int(const std::string& name, int64_t* target, const std::string& help) {
  flags_.push_back({name, Kind::kInt, target, help, absl::StrCat(*target)});
}

void FlagParser::Double(const std::string& name, double* target, const std::string& help) {
  flags_.push_back({name, Kind::kDouble, target, help, absl::StrCat(*target)});
}

void FlagParser::Strings(const std::string& name, std::vector<std::string>* target,
                         const std::string& help) {
  flags_.push_back({name, Kind::kStrings, target, help, ""});
}

const FlagParser::Flag* FlagParser::Find(const std::string& name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status FlagParser::Set(const Flag& flag, const std::string& value) const {
  auto bad = [&](absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, "=", value, ": expected ", expected));
  };
  switch (flag.kind) {
    case Kind::kString: *static_cast<std::string*>(flag.target) = value; break;
    case Kind::kStrings:
      static_cast<std::vector<std::string>*>(flag.target)->push_back(value);
      break;
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(flag.target) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(flag.target) = false;
      } else {
        return bad("true or false");
      }
      break;
    case Kind::kInt:
      if (!absl::SimpleAtoi(value, static_cast<int64_t*>(flag.target))) return bad("an integer");
      break;
    case Kind::kDouble: {
      double d;
      if (!absl::SimpleAtod(value, &d) || !std::isfinite(d)) return bad("a number");
      *static_cast<double*>(flag.target) = d;
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status FlagParser::Parse(const std::vector<std::string>& args,
                               std::vector<std::string>* positional) const {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional->insert(positional->end(), args.begin() + i + 1, args.end());
      return absl::OkStatus();
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      positional->push_back(arg);
      continue;
    }
    const size_t equals = arg.find('=');
    const std::string name =
        arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    const Flag* flag = Find(name);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (equals != std::string::npos) {
      if (absl::Status s = Set(*flag, arg.substr(equals + 1)); !s.ok()) return s;
    } else if (flag->kind == Kind::kBool) {
      *static_cast<bool*>(flag->target) = true;
    } else if (i + 1 < args.size()) {
      if (absl::Status s = Set(*flag, args[++i]); !s.ok()) return s;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
  }
  return absl::OkStatus();
}

std::string FlagParser::Help() const {
  std::vector<std::string> lines;
  for (const Flag& flag : flags_) {
    std::string usage = absl::StrCat("  --", flag.name, flag.kind == Kind::kBool ? "" : "=VALUE");
    std::string text = flag.help;
    // Zero means "off" for the numeric flags here; saying so adds nothing.
    if (!flag.default_value.empty() && flag.default_value != "0" && flag.kind != Kind::kBool) {
      absl::StrAppend(&text, " (default: ", flag.default_value, ")");
    }
    lines.push_back(absl::StrFormat("%-28s %s", usage, text));
  }
  return absl::StrCat(absl::StrJoin(lines, "\n"), "\n");
}

void AddConnectionFlags(FlagParser& parser, ConnectionFlags* flags) {
  parser.String("address", &flags->address, "server address host:port");
  parser.Double("timeout", &flags->timeout_seconds,
                "seconds each call may take, its retries included");
  parser.Int("max_attempts", &flags->max_attempts,
             "attempts per call when the server is UNAVAILABLE (1: no retry)");
  parser.Bool("tls", &flags->tls, "speak TLS, verifying the server with the default roots");
  parser.String("tls_ca", &flags->tls_ca, "PEM root CA that signed the server's certificate");
  parser.String("tls_cert", &flags->tls_cert, "PEM client certificate for mutual TLS");
  parser.String("tls_key", &flags->tls_key, "PEM private key of --tls_cert");
  parser.String("tls_server_name", &flags->tls_server_name,
                "name to expect in the server's certificate (default: the address's host)");
  parser.String("admin_token_file", &flags->admin_token_file,
                "file holding the admin token (sent as 'authorization: Bearer <token>')");
}

absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const ConnectionFlags& flags) {
  ClientOptions options;
  if (flags.address.empty()) return absl::InvalidArgumentError("--address is empty");
  options.address = flags.address;
  if (flags.timeout_seconds <= 0) {
    return absl::InvalidArgumentError("--timeout must be a positive number of seconds");
  }
  options.timeout = absl::Seconds(flags.timeout_seconds);
  if (flags.max_attempts < 1) return absl::InvalidArgumentError("--max_attempts must be >= 1");
  options.retry.max_attempts = static_cast<int>(flags.max_attempts);
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

}  // namespace precompile::client
