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
//
// The same launcher variables place the process in its job for the stats
// dump ("rank", "world_size", "rank_variable", "job"), so that
// `cachalloc-report job DIR` can merge the dumps of every rank.
#pragma once

#include <cstdint>
#include <optional>
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

// Where this process stands in its job, as its launcher set the environment.
struct JobPlace {
  // The rank %r names, as a number; none when no rank variable is set or its
  // value is not a decimal number (%r still names the file: "0", or the text).
  std::optional<std::int64_t> rank;
  // The size that goes with that rank variable (RANK: WORLD_SIZE,
  // SLURM_PROCID: SLURM_NTASKS, ...), when its launcher sets one.
  std::optional<std::int64_t> world_size;
  std::string rank_variable;  // the variable the rank came from; "" if none
  // "VARIABLE=value" of the first job identifier set (TORCHELASTIC_RUN_ID,
  // PMIX_NAMESPACE, SLURM_JOB_ID, ...); "" if none.  The ranks of one job
  // share it; dumps of two jobs in one folder differ in it.
  std::string job;
};

JobPlace job_place_from_environment();

std::string expand_path_template(std::string_view tmpl, const TemplateContext& ctx);

}  // namespace cachalloc::obs
