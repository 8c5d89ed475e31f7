/// Resize and Upsample through the loop IR (placeholder registration; lowerings land here).
#include "lower/lowering.h"

namespace kiln::lower {

void register_resize_ops(Registry&) {}

}  // namespace kiln::lower
