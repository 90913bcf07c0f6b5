// Plain-text tables for the client tools' human output. Written here
// because no Debian C++ package lays out a text table: fmt pads one cell at
// a time, but finding each column's width is the whole job.
#ifndef PRECOMPILE_CLIENT_TABLE_H_
#define PRECOMPILE_CLIENT_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

namespace precompile::client {

// How the columns after the first are aligned; the first is always left.
enum class Align { kLeft, kRight };

// Prints `rows` (the first one usually a header) with each column padded to
// its widest cell and two spaces between columns. Trailing spaces are not
// printed.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                Align rest = Align::kLeft);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_TABLE_H_
