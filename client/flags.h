// Command-line flags for the client tools. The tools parse their arguments
// with this small parser instead of absl flags so that they can run
// in-process more than once (as their tests do) without global state.
//
// Accepted forms: --name=value, --name value, --bool_flag,
// --bool_flag=true|false; "--" ends the flags. Anything else is a positional
// argument, kept in order.
//
// Thread safety: a FlagParser is used by one thread.
#ifndef PRECOMPILE_CLIENT_FLAGS_H_
#define PRECOMPILE_CLIENT_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client_options.h"

namespace precompile::client {

class FlagParser {
 public:
  // Registers a flag writing into `target`, which must outlive Parse; its
  // current value is the default shown in Help.
  void String(const std::string& name, std::string* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  // A flag that may be repeated; each use appends.
  void Strings(const std::string& name, std::vector<std::string>* target, const std::string& help);

  // INVALID_ARGUMENT for an unknown flag, a missing or malformed value.
  absl::Status Parse(const std::vector<std::string>& args,
                     std::vector<std::string>* positional) const;

  // One line per flag: "  --name=VALUE  help (default: ...)".
  std::string Help() const;

 private:
  enum class Kind { kString, kBool, kInt, kDouble, kStrings };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    std::string help;
    std::string default_value;
  };
  const Flag* Find(const std::string& name) const;
  absl::Status Set(const Flag& flag, const std::string& value) const;

  std::vector<Flag> flags_;
};

// The connection flags both tools take.
struct ConnectionFlags {
  std::string address = "127.0.0.1:8001";
  double timeout_seconds = 30;
  int64_t max_attempts = 3;
  bool tls = false;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string admin_token_file;
};

void AddConnectionFlags(FlagParser& parser, ConnectionFlags* flags);

// ClientOptions from the flags; reads the admin token file. INVALID_ARGUMENT
// or NOT_FOUND say which flag is wrong.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags(const ConnectionFlags& flags);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_FLAGS_H_
