// Fuzzes list files (datasets/io/url.h, parse_list_file): any bytes either give names or raise
// DatasetError; every name is a URL on the list's own server, once.
#include <cstdint>
#include <set>
#include <string>

#include "datasets/dataset_error.h"
#include "datasets/io/url.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = pipeline::datasets::io;
  static const io::RemoteUrl https = io::parse_remote_url("https://data.example:8443/sets/fineweb/files.txt");
  static const io::RemoteUrl s3 = io::parse_remote_url("s3://bucket/sets/list.txt");
  for (const io::RemoteUrl* list : {&https, &s3}) {
    try {
      const auto names = io::parse_list_file(fuzz_util::as_text(data, size), *list);
      std::set<std::string> seen;
      for (const auto& n : names) {
        if (n.scheme != list->scheme || n.host != list->host) fuzz_util::broken("a name off the list's server: " + n.text());
        if (!seen.insert(n.text()).second) fuzz_util::broken("a name twice: " + n.text());
      }
    } catch (const pipeline::datasets::DatasetError&) {
    }
  }
  return 0;
}
