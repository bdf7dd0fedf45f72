#!/bin/sh
# curl-examples.sh - one request per route and per model family.
# Start the daemon first (e.g. `canopy serve --models-dir models`), with
# models named after their families. CANOPY_URL overrides the address.
set -eu
U=${CANOPY_URL:-http://127.0.0.1:8080}
run() { echo "\$ curl $*" >&2; curl -sS "$@"; echo; }

run "$U/healthz"
run "$U/readyz"
run "$U/v1/models"
run "$U/v1/models/treelstm"

# treelstm, treegru, mvrnn: a bracketed (Penn / SST) tree
run -H 'X-Request-Id: demo-1' -d '{"instances": [{"tree": "(3 (2 It) (4 (2 is) (2 fine)))"}]}' \
  "$U/v1/models/treelstm/infer"
run -d '{"tree": "(3 (2 It) (4 (2 is) (2 fine)))", "outputs": "all"}' "$U/v1/models/treegru/infer"
run -d '{"tree": "(3 (2 It) (4 (2 is) (2 fine)))", "return_hidden": true}' "$U/v1/models/mvrnn/infer"
# treelstm-2type: a JSON tree whose internal nodes carry a type
run -d '{"tree": {"type": "b", "children": [{"word": "good"}, {"type": "a", "children": [{"word": "film"}, {"word": "."}]}]}}' \
  "$U/v1/models/treelstm-2type/infer"
# childsum-treelstm: any number of children
run -d '{"tree": "(S (NP the film) (VP was (ADJP very good)) .)"}' "$U/v1/models/childsum-treelstm/infer"
# sequences, lattices and DAGs (bilstm-tagger, lstm-nmt, latticelstm, latticegru)
run -d '{"tokens": ["the", "film", "was", "good"]}' "$U/v1/models/bilstm-tagger/infer" || true
run -d '{"text": "the film was good", "max_decode_len": 20}' "$U/v1/models/lstm-nmt/infer" || true
run -d '{"text": "南京市长江大桥"}' "$U/v1/models/latticelstm/infer" || true
run -d '{"nodes": [{"token": "a", "prev": []}, {"token": "b", "prev": [0]}]}' "$U/v1/models/latticegru/infer" || true
# the Open Inference Protocol (KServe v2): metadata, and INSTANCE as BYTES,
# each element a /v1 instance as a JSON string (docs/api.md)
run "$U/v2"
run "$U/v2/models/bilstm-tagger"
run -d '{"id": "demo-2", "inputs": [{"name": "INSTANCE", "datatype": "BYTES", "shape": [1], "data": ["{\"tokens\": [\"the\", \"film\"]}"]}]}' \
  "$U/v2/models/bilstm-tagger/infer" || true
# errors are JSON objects with a code (docs/api.md)
run -d '{"tree": "(3 (2 It)"}' "$U/v1/models/treelstm/infer"
run -d '{"tree": "(2 a)", "timeout_ms": 1}' "$U/v1/models/treelstm/infer"
run "$U/metrics" | head -n 20
