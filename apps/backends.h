// Registers the concrete backends compiled into this binary (the only place besides tests that
// names them).
#pragma once

namespace dh::app {
void RegisterLinkedBackends();
}  // namespace dh::app
