/* limits.c - what a request body may hold, decided from bodyscan.c's
 * counts before jansson builds it: for /v1 (infer.c) and for a v2
 * request's instances (kserve.c) alike.
 */
#include "bodyscan.h"
#include "handlers.h"

/* How many JSON objects and arrays a request of n instances may hold
 * (bodyscan.c counts them before jansson runs). In a request of the forms
 * of docs/api.md every object is the top-level object, an instance, a
 * JSON tree node, a lattice word or a DAG node, and each of the last
 * three is at least one vertex of its instance (cn_instance_vertices:
 * a tree node one or more, a lattice span 2, a DAG node 1), so objects
 * <= 1 + n + vertices <= 1 + n + max-vertices. Every array is
 * "instances", an instance's "tokens", "chars", "words" or "nodes" (at
 * most two an instance), a tree node's "children" or a DAG node's "prev"
 * (at most one a vertex), so arrays <= 1 + 2n + max-vertices. SLACK
 * covers option fields grown later. What this refuses is a body that no
 * request within max-vertices is, or one whose ignored keys (which an
 * instance may carry, docs/api.md) hold more containers than that:
 * documented as such. It bounds jansson's memory for one parse to about
 * (max-vertices + 3n) x ~230 bytes for containers; scalars (strings,
 * numbers) cost jansson ~20x their bytes and are bounded by
 * max-body-bytes only (docs/daemon.md). */
enum { CONTAINER_SLACK = 16 };

int cn__limits_too_many_instances(cn_err *e, size_t n, int max) {
  return cn_err_set(e, CN_E_TOO_LARGE,
                    "%zu instances; at most %d per request "
                    "(max-instances-per-request)",
                    n, max);
}

int cn__limits_check_counts(const cn__server *s, const cn__body_counts *k,
                            cn_err *e) {
  const cn_serve_config *sc = &s->cfg.serve;
  if (k->instances > (size_t)sc->max_instances_per_request)
    return cn__limits_too_many_instances(e, k->instances, sc->max_instances_per_request);
  size_t n = k->instances, mv = (size_t)sc->max_vertices;
  size_t max_obj = 1 + n + mv + CONTAINER_SLACK;
  size_t max_arr = 1 + 2 * n + mv + CONTAINER_SLACK;
  if (k->objects > max_obj || k->arrays > max_arr) {
    bool obj = k->objects > max_obj;
    return cn_err_set(e, CN_E_TOO_LARGE,
                      "the body holds %zu JSON %s; a request of %zu "
                      "instances holds at most %zu (one an instance, tree "
                      "node, lattice word or DAG node: max-vertices + "
                      "instances)",
                      obj ? k->objects : k->arrays, obj ? "objects" : "arrays",
                      n, obj ? max_obj : max_arr);
  }
  return 0;
}
