// start_up.cpp — start-up, with the steps of the floors above
// process_state handed down (start_up.h).
#include "start_up.h"

#include "context_registry.h"
#include "link_imports.h"
#include "report_source.h"

namespace cachalloc::shim {
namespace {

// A new context's cache (context_registry.h): objects loaded since the
// last look are read for unseen imports, and the context starts outside
// the single sequence once any was found.
constexpr ContextCreationHooks kContextCreation{unseen_link_imports, check_link_imports};

constexpr StartUpSteps kSteps{start_observability, check_link_imports_at_start};

}  // namespace

Mode detail::start_up() {
  // Before the mode is decided: no context's cache exists before that.
  set_context_creation_hooks(kContextCreation);
  return initialize_mode(kSteps);
}

bool detail::time_wrappers_after_init() {
  (void)current_mode();
  return g_time_wrappers.load(std::memory_order_relaxed) > 0;
}

}  // namespace cachalloc::shim
