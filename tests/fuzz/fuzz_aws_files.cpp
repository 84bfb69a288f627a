// Fuzzes the AWS credentials and config files (datasets/io/credentials.h) as resolve_s3_access
// reads them: any bytes either resolve or raise DatasetError, whose message never quotes the
// file's text (it may hold a key).
#include <cstdint>
#include <map>
#include <string>

#include "datasets/dataset_error.h"
#include "datasets/io/credentials.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = pipeline::datasets::io;
  static fuzz_util::InputFile file;
  const std::string path = file.write(data, size);
  const std::map<std::string, std::string> vars = {{"HOME", "/nonexistent"},
                                                   {"AWS_SHARED_CREDENTIALS_FILE", path},
                                                   {"AWS_CONFIG_FILE", path}};
  const io::EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  for (const char* profile : {"", "dev"}) {
    try {
      const io::S3Access a = io::resolve_s3_access({.profile = profile}, env);
      if (!a.secret.empty() && a.describe().find(a.secret.reveal()) != std::string::npos)
        fuzz_util::broken("a secret in describe()");
    } catch (const pipeline::datasets::DatasetError& e) {
      const std::string what = e.what();
      const std::string text(fuzz_util::as_text(data, size));
      // The message names the file and section, never a value: a line of the file longer than a
      // section header is never in it.
      for (size_t at = 0; at < text.size();) {
        const size_t nl = std::min(text.find('\n', at), text.size());
        const std::string line = text.substr(at, nl - at);
        if (line.size() >= 24 && line.find('=') != std::string::npos && what.find(line) != std::string::npos)
          fuzz_util::broken("a line of the file in an error: " + what);
        at = nl + 1;
      }
    }
  }
  return 0;
}
