#include "precision/shape_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace refit::precision {

namespace {

std::int64_t power_of_two_at_least(std::int64_t n) {
  std::int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr const char* kStoreFormat = "refit-bf16-shape-routing/1";

// An exclusive flock on `path` for the object's life; without it (a read-only folder) the store
// is still read and written, unlocked.
class FileLock {
 public:
  explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

std::map<std::string, ShapeDecision> read_shape_store(const std::string& path) {
  std::map<std::string, ShapeDecision> out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return out;
  if (const auto f = j.find("format"); f == j.end() || !f->is_string() || *f != kStoreFormat) return out;
  const auto it = j.find("decisions");
  if (it == j.end() || !it->is_object()) return out;
  for (const auto& [name, e] : it->items()) {
    if (!e.is_object()) return {};
    const auto route = e.find("route");
    const auto native = e.find("native_seconds");
    const auto fp32 = e.find("fp32_seconds");
    if (route == e.end() || !route->is_string() || (*route != "fp32" && *route != "native") || native == e.end() ||
        !native->is_number() || fp32 == e.end() || !fp32->is_number())
      return {};  // damaged: ignored whole (the next decision rewrites it)
    ShapeDecision d;
    d.shape_class = name;
    d.fp32 = *route == "fp32";
    d.native_seconds = native->get<double>();
    d.fp32_seconds = fp32->get<double>();
    const auto time = [](double t) { return std::isfinite(t) && t >= 0; };
    if (!time(d.native_seconds) || !time(d.fp32_seconds)) return {};
    if (const auto g = e.find("native_given_up"); g != e.end()) {
      if (!g->is_boolean()) return {};
      d.native_given_up = g->get<bool>();
    }
    d.from_store = true;
    out.emplace(name, d);
  }
  return out;
}

void write_shape_store(const std::string& path, const std::map<std::string, ShapeDecision>& decisions) {
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [name, d] : decisions)
    entries[name] = {{"route", d.fp32 ? "fp32" : "native"},
                     {"native_seconds", d.native_seconds},
                     {"fp32_seconds", d.fp32_seconds},
                     {"native_given_up", d.native_given_up}};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // no store here (a read-only folder): this process's decisions stay its own
    out << nlohmann::json{{"format", kStoreFormat}, {"decisions", entries}}.dump(1) << "\n";
    if (!out.flush()) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

std::string shape_class(const std::string& op, const std::vector<std::vector<std::int64_t>>& operand_sizes,
                        const std::string& layouts) {
  std::string s = op;
  for (std::size_t o = 0; o < operand_sizes.size(); ++o) {
    const auto& sizes = operand_sizes[o];
    s += ' ';
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i) s += 'x';
      s += std::to_string(power_of_two_at_least(sizes[i]));
    }
    if (o < layouts.size() && layouts[o] != 'c') s += layouts[o];
  }
  return s;
}

ShapeRouting::ShapeRouting(ShapeRoutingOptions options) : options_(std::move(options)) {
  if (!options_.clock) options_.clock = steady_seconds;
  options_.warmups = std::max(0, options_.warmups);
  options_.reps = std::max(1, options_.reps);
}

double ShapeRouting::fastest(const std::function<void()>& run, double give_up_after, bool* gave_up) const {
  for (int i = 0; i < options_.warmups; ++i) {
    if (i == 0 && give_up_after > 0) {
      const double t0 = options_.clock();
      run();
      const double first = options_.clock() - t0;
      if (first > give_up_after) {
        if (gave_up) *gave_up = true;
        return first;
      }
      continue;
    }
    run();
  }
  double best = 1e300;
  for (int i = 0; i < options_.reps; ++i) {
    const double t0 = options_.clock();
    run();
    best = std::min(best, options_.clock() - t0);
  }
  return best;
}

ShapeDecision ShapeRouting::measure(const std::string& shape_class, const std::function<void()>& run_native,
                                    const std::function<void()>& run_fp32) const {
  ShapeDecision d;
  d.shape_class = shape_class;
  d.fp32_seconds = fastest(run_fp32);
  const double give_up_after = std::max(options_.give_up_ratio * d.fp32_seconds, options_.give_up_seconds);
  d.native_seconds = fastest(run_native, give_up_after, &d.native_given_up);
  d.fp32 = d.native_given_up || d.fp32_seconds < d.native_seconds;
  return d;
}

bool ShapeRouting::route_fp32(const std::string& shape_class, const std::function<void()>& run_native,
                              const std::function<void()>& run_fp32) {
  // Held while a new class is timed: another thread's call of the same class waits for the
  // decision rather than timing it again (and the two timings do not share the cores).
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto it = decided_.find(shape_class);
  if (it == decided_.end()) {
    ShapeDecision d;
    if (options_.store.empty()) {
      d = measure(shape_class, run_native, run_fp32);
    } else {
      // Read, time if absent, write back: all under the lock file, so that every process on
      // the machine takes the first decision recorded.
      // A product timed here may dispatch products of its own (a convolution's), which come back
      // here on this thread: the file lock is taken once (a second flock would wait on the first).
      std::optional<FileLock> file_lock;
      if (store_depth_ == 0) file_lock.emplace(options_.store + ".lock");
      struct Depth {
        int& depth;
        explicit Depth(int& d) : depth(++d) {}
        ~Depth() { --depth; }
      } depth(store_depth_);
      const auto stored = read_shape_store(options_.store);
      if (auto s = stored.find(shape_class); s != stored.end()) {
        d = s->second;
      } else {
        d = measure(shape_class, run_native, run_fp32);
        auto now = read_shape_store(options_.store);  // with what nested decisions added meanwhile
        now[shape_class] = d;
        write_shape_store(options_.store, now);
      }
    }
    it = decided_.emplace(shape_class, std::move(d)).first;
  }
  ++it->second.calls;
  return it->second.fp32;
}

std::vector<ShapeDecision> ShapeRouting::decisions() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::vector<ShapeDecision> out;
  out.reserve(decided_.size());
  for (const auto& [name, d] : decided_) out.push_back(d);
  return out;
}

}  // namespace refit::precision
