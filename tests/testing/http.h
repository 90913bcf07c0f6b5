// A minimal HTTP/1.0 GET over loopback, to scrape /metrics as Prometheus does.
#ifndef PRECOMPILE_TESTS_TESTING_HTTP_H_
#define PRECOMPILE_TESTS_TESTING_HTTP_H_

#include <string>

namespace precompile::testing {

// The body of GET http://127.0.0.1:<port><path>; empty on any failure.
std::string HttpGet(int port, const std::string& path);

// The value of the sample whose line starts with `series` (the metric name
// and its labels exactly as exposed, e.g. 'name{a="1"}'); -1 if absent.
double MetricValue(const std::string& exposition, const std::string& series);

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_HTTP_H_
