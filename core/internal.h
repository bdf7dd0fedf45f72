/* internal.h - every internal header of core/ at once, for the tests and
 * the fuzz targets (tests/). Nothing under core/ includes it: each file
 * includes its own folder's header and those of the folders below
 * (docs/architecture.md; tests/check_layout.py enforces it). server/ sees
 * canopy_core.h only. */
#ifndef CANOPY_CORE_INTERNAL_H
#define CANOPY_CORE_INTERNAL_H

#include "base/base.h"
#include "input/input.h"
#include "cell/cell.h"
#include "model/model.h"
#include "sched/sched_api.h"
#include "run/run_api.h"

#endif /* CANOPY_CORE_INTERNAL_H */
