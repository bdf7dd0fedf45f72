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
# errors: the status and the JSON body, whose code says what was wrong and
# where (docs/api.md; /v2 answers {"error": "..."} as its protocol says).
# Each example must answer the status it shows: else the script says so
# and exits 1.
err() { # expected-status curl-arguments...
  want=$1
  shift
  echo "\$ curl $*    # -> $want" >&2
  out=$(curl -sS -w '\n%{http_code}' "$@")
  code=$(printf '%s\n' "$out" | tail -n 1)
  printf 'HTTP %s %s\n' "$code" "$(printf '%s\n' "$out" | sed '$d')"
  [ "$code" = "$want" ] || { echo "curl-examples: expected $want, got $code" >&2; exit 1; }
}
err 400 -d '{"tree": "(3 (2 It)"}' "$U/v1/models/treelstm/infer"          # bad_tree, with the byte
err 400 -d '{"tokens": ["It", "is"]}' "$U/v1/models/treelstm/infer"       # bad_instance: a tree model
err 400 -d 'not json' "$U/v1/models/treelstm/infer"                       # bad_json, with the offset
err 404 -d '{"tree": "(2 a)"}' "$U/v1/models/no-such-model/infer"         # no_such_model
err 405 "$U/v1/models/treelstm/infer"                                    # GET on infer: method_not_allowed
err 400 -d '{"inputs": []}' "$U/v2/models/treelstm/infer"                # /v2: {"error": "..."}
# the first lines of the metrics (sed reads to the end: no broken pipe)
echo "\$ curl $U/metrics | sed -n 1,20p" >&2
curl -sS "$U/metrics" | sed -n 1,20p
