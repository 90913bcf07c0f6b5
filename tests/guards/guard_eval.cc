// The runtime's guard programs as a process, for the differential test
// (test_guard_agreement.py): reads records from stdin, each a little-endian
// uint32 length and that many bytes in the guard fuzzer's format (a frame and
// a call, tests/fuzz/fuzz_checks.h), and writes one line per record: each
// variant's answer (1 holds, 0 does not, - does not compile), or "error" and
// the reason.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "tests/fuzz/fuzz_checks.h"

int main() {
  std::vector<uint8_t> record;
  while (true) {
    uint8_t header[4];
    if (std::fread(header, 1, 4, stdin) != 4) return 0;
    const uint32_t size = header[0] | header[1] << 8 | header[2] << 16 |
                          static_cast<uint32_t>(header[3]) << 24;
    record.resize(size);
    if (size > 0 && std::fread(record.data(), 1, size, stdin) != size) return 1;
    absl::StatusOr<std::vector<int>> results =
        precompile::fuzz::EvaluateGuards(record.data(), record.size());
    if (!results.ok()) {
      std::printf("error %s\n", std::string(results.status().message()).c_str());
    } else {
      std::printf("%s\n", absl::StrJoin(*results, " ", [](std::string* out, int r) {
                    out->append(r < 0 ? "-" : std::to_string(r));
                  }).c_str());
    }
    std::fflush(stdout);
  }
}
