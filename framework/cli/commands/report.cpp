#include "cli/commands/report.h"

#include "run/run_report.h"

namespace refit::cli {

void report(const std::filesystem::path& run_dir, std::FILE* out) {
  write_run_report(run_dir);
  std::fprintf(out, "wrote %s and %s\n", (run_dir / "report.html").c_str(), (run_dir / "metrics.csv").c_str());
}

}  // namespace refit::cli
