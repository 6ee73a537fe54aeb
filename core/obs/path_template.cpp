// path_template.cpp — see path_template.h.
#include "path_template.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>

namespace cachalloc::obs {

// The order matters where launchers nest: under `srun torchrun ...` every
// worker of a node shares SLURM_PROCID (torchrun's own task) while RANK is
// the worker's global rank; an MPI launcher's rank variable names the same
// process as SLURM_PROCID where both are set.  LOCAL_RANK alone (a launcher that
// sets no global rank) is the last resort.
std::string rank_from_environment() {
  static constexpr const char* kRankVariables[] = {
      "RANK",                  // torchrun, torch.distributed.launch, accelerate, DeepSpeed
      "OMPI_COMM_WORLD_RANK",  // Open MPI's mpirun
      "PMIX_RANK",             // PMIx launchers (prterun, srun --mpi=pmix)
      "PMI_RANK",              // MPICH and Intel MPI (Hydra mpiexec)
      "MV2_COMM_WORLD_RANK",   // MVAPICH2
      "FLUX_TASK_RANK",        // Flux
      "JSM_NAMESPACE_RANK",    // IBM jsrun
      "SLURM_PROCID",          // srun
      "LOCAL_RANK",            // torchrun's rank within the node, when nothing else is set
  };
  for (const char* name : kRankVariables) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "0";
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

std::string utc_datetime() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// A value is part of one file name: a '/' in it (a host or rank from outside
// the program) becomes '_', and so does every dot of a value made of dots
// only ("." or ".."), so that the file stays where the template puts it.
void append_value(std::string& out, const std::string& value) {
  const bool only_dots = value.find_first_not_of('.') == std::string::npos;
  for (char c : value) out += (c == '/' || only_dots) ? '_' : c;
}

}  // namespace

TemplateContext current_template_context() {
  return TemplateContext{std::to_string(getpid()), host_name(), rank_from_environment(), utc_datetime()};
}

std::string expand_path_template(std::string_view tmpl, const TemplateContext& ctx) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '%' || i + 1 == tmpl.size()) {
      out += tmpl[i];
      continue;
    }
    char c = tmpl[++i];
    switch (c) {
      case 'p': append_value(out, ctx.pid); break;
      case 'h': append_value(out, ctx.host); break;
      case 'r': append_value(out, ctx.rank); break;
      case 'd': append_value(out, ctx.datetime); break;
      case '%': out += '%'; break;
      default:  // unknown placeholder: keep it as written
        out += '%';
        out += c;
    }
  }
  return out;
}

}  // namespace cachalloc::obs
