// path_template.cpp — see path_template.h.
#include "path_template.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>

namespace cachalloc::obs {

namespace {

// A rank variable and the job size its launcher sets beside it (nullptr:
// none that says the whole job's size).
struct RankVariable {
  const char* rank;
  const char* size;
};

// The order matters where launchers nest: under `srun torchrun ...` every
// worker of a node shares SLURM_PROCID (torchrun's own task) while RANK is
// the worker's global rank; an MPI launcher's rank variable names the same
// process as SLURM_PROCID where both are set.  LOCAL_RANK alone (a launcher that
// sets no global rank) is the last resort.
constexpr RankVariable kRankVariables[] = {
    {"RANK", "WORLD_SIZE"},                                  // torchrun, torch.distributed.launch, accelerate, DeepSpeed
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},        // Open MPI's mpirun
    {"PMIX_RANK", nullptr},                                  // PMIx launchers (prterun, srun --mpi=pmix)
    {"PMI_RANK", "PMI_SIZE"},                                // MPICH and Intel MPI (Hydra mpiexec)
    {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"},          // MVAPICH2
    {"FLUX_TASK_RANK", "FLUX_JOB_SIZE"},                     // Flux
    {"JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE"},            // IBM jsrun
    {"SLURM_PROCID", "SLURM_NTASKS"},                        // srun
    {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},                      // torchrun's rank within the node, when nothing else is set
};

// Job identifiers, the launcher's own first: two torchrun or mpirun jobs run
// one after the other inside one Slurm allocation share SLURM_JOB_ID but not
// these.  torchrun's static rendezvous without --rdzv-id says "none", which
// tells no job apart.
constexpr const char* kJobVariables[] = {
    "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "FLUX_JOB_ID",
    "SLURM_JOB_ID",        "LSB_JOBID",      "PBS_JOBID",
};

const char* env_value(const char* name) {
  if (name == nullptr) return nullptr;
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

const RankVariable* rank_variable_set() {
  for (const RankVariable& var : kRankVariables)
    if (env_value(var.rank) != nullptr) return &var;
  return nullptr;
}

// A decimal number, all of the text; none otherwise ("", "3x", "-", overflow).
std::optional<std::int64_t> whole_number(const char* text) {
  if (text == nullptr) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

std::string job_identifier() {
  for (const char* name : kJobVariables) {
    const char* v = env_value(name);
    if (v != nullptr && std::string_view(v) != "none") return std::string(name) + "=" + v;
  }
  return "";
}

}  // namespace

std::string rank_from_environment() {
  const RankVariable* var = rank_variable_set();
  return var != nullptr ? env_value(var->rank) : "0";
}

JobPlace job_place_from_environment() {
  JobPlace place;
  place.job = job_identifier();
  const RankVariable* var = rank_variable_set();
  if (var == nullptr) return place;
  place.rank_variable = var->rank;
  place.rank = whole_number(env_value(var->rank));
  place.world_size = whole_number(env_value(var->size));
  return place;
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
