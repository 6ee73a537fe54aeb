// path_template.h — expanding the %-placeholders of stats/snapshot/trace paths.
//
// So that every process of a multi-process job writes its own file:
//   %p  process id
//   %h  host name
//   %r  rank: the first of RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI),
//       PMIX_RANK, PMI_RANK (MPICH, Intel MPI), MV2_COMM_WORLD_RANK,
//       FLUX_TASK_RANK, JSM_NAMESPACE_RANK, SLURM_PROCID (srun), LOCAL_RANK
//       that is set and non-empty; "0" when none is (a single process)
//   %d  UTC date and time when the file is written, "YYYYmmdd-HHMMSS".
//       Not the CUDA device: one file holds every device of the process.
//   %%  a literal '%'
// Any other "%x" (and a trailing lone '%') is kept as written.
#pragma once

#include <string>
#include <string_view>

namespace cachalloc::obs {

struct TemplateContext {
  std::string pid;
  std::string host;
  std::string rank;
  std::string datetime;
};

// The context of this process now (getpid, gethostname, environment, clock).
TemplateContext current_template_context();

// The rank from the environment, or "0".
std::string rank_from_environment();

std::string expand_path_template(std::string_view tmpl, const TemplateContext& ctx);

}  // namespace cachalloc::obs
