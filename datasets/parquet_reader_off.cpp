// The Parquet reader of a build without Arrow (PIPELINE_WITH_PARQUET=OFF): Parquet input is still
// recognised (parquet_files.cpp), and refused with a sentence that says how to get it.
#include "datasets/parquet_reader.h"

namespace pipeline::datasets {
namespace {
[[noreturn]] void unavailable(const std::string& what) {
  throw DatasetError(what + ": this build reads no Parquet (configured with PIPELINE_WITH_PARQUET=OFF); "
                     "rebuild with tools/setup.sh, which brings Arrow C++ from the pyarrow wheel");
}
}  // namespace

bool parquet_available() { return false; }

struct ParquetDocumentReader::Impl {};

ParquetDocumentReader::ParquetDocumentReader() = default;
ParquetDocumentReader::~ParquetDocumentReader() = default;
ParquetDocumentReader::ParquetDocumentReader(ParquetDocumentReader&&) noexcept = default;
ParquetDocumentReader& ParquetDocumentReader::operator=(ParquetDocumentReader&&) noexcept = default;

void ParquetDocumentReader::open(const std::filesystem::path& source, DatasetPosition, bool, ParquetReaderOptions) {
  unavailable(source.string());
}
bool ParquetDocumentReader::next(std::string&, DocMark*) { unavailable("parquet reader"); }
bool ParquetDocumentReader::next(std::string_view&, DocMark*) { unavailable("parquet reader"); }
DatasetPosition ParquetDocumentReader::position() const { return {}; }
std::string ParquetDocumentReader::describe(const DatasetPosition& p) const { return p.str(); }
const std::vector<std::filesystem::path>& ParquetDocumentReader::files() const {
  static const std::vector<std::filesystem::path> none;
  return none;
}
uint64_t ParquetDocumentReader::row_groups() const { return 0; }
uint64_t ParquetDocumentReader::rows() const { return 0; }
uint64_t ParquetDocumentReader::nulls_skipped() const { return 0; }
uint64_t ParquetDocumentReader::documents_read() const { return 0; }

std::vector<std::string> read_parquet_buffer(std::string_view, const std::string& name, const std::string&, size_t) {
  unavailable(name);
}

}  // namespace pipeline::datasets
