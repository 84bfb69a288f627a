// Fuzzes the text forms of remote sources (datasets/io/url.h): a source URL either parses or
// raises DatasetError; what parses prints back to itself and prints no query string; printing
// (redact_urls) is idempotent and keeps no query; a brace pattern expands to at most the limit of
// names with no brace left, or raises DatasetError.
#include <cstdint>
#include <string>

#include "datasets/dataset_error.h"
#include "datasets/io/url.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = pipeline::datasets::io;
  const std::string text(fuzz_util::as_text(data, size));
  try {
    const io::RemoteUrl u = io::parse_remote_url(text, {"https://hub.example"});
    io::RemoteUrl again;
    try {
      again = io::parse_remote_url(u.text());
    } catch (const pipeline::datasets::DatasetError& e) {
      fuzz_util::broken("a parsed URL does not parse again: " + u.text() + ": " + e.what());
    }
    if (again.text() != u.text()) fuzz_util::broken("URL round trip changed it: " + u.text() + " -> " + again.text());
    const std::string printed = u.redacted();
    if (!u.query.empty() && printed.find("?<redacted>") == std::string::npos)
      fuzz_util::broken("a query string printed: " + printed);
    try {
      (void)u.sibling("x/y.bin");
    } catch (const pipeline::datasets::DatasetError&) {
    }
  } catch (const pipeline::datasets::DatasetError&) {
  }
  const std::string once = io::redact_urls(text);
  if (io::redact_urls(once) != once) fuzz_util::broken("redact_urls is not idempotent on: " + text);
  try {
    const auto names = io::expand_braces(text, 4096);
    if (names.size() > 4096) fuzz_util::broken("more names than the limit");
    for (const auto& n : names)
      if (n.find('{') != std::string::npos || n.find('}') != std::string::npos)
        fuzz_util::broken("a brace left in an expanded name: " + n);
  } catch (const pipeline::datasets::DatasetError&) {
  }
  return 0;
}
