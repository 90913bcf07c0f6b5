#include "client/table.h"

#include <algorithm>

namespace precompile::client {

void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                Align rest) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string& cell = row[i];
      const std::string pad(widths[i] - cell.size(), ' ');
      if (i > 0) line += "  ";
      if (i > 0 && rest == Align::kRight) {
        line += pad + cell;
      } else {
        line += cell;
        if (i + 1 < row.size()) line += pad;
      }
    }
    out << line << "\n";
  }
}

}  // namespace precompile::client
