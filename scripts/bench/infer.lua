-- infer.lua - wrk script for `canopy serve` (scripts/bench/daemon.sh).
--
-- Posts request bodies read from a file, one JSON body a line (each
-- {"instances": [...]} with 1 or more real data trees, written by
-- daemon.sh), cycling through them in order; each wrk thread starts
-- at a different line. At the end prints one line, "wrk-json {...}", with
-- the counts and the latency percentiles (microseconds) the script reads.
--
-- usage: wrk -t1 -c64 -d5s -s infer.lua \
--          http://127.0.0.1:PORT/v1/models/treelstm/infer -- BODIES.txt

local bodies = {}
local next_body = 0

local threads = {}

function setup(thread)
  thread:set("offset", #threads * 9973)
  table.insert(threads, thread)
end

function init(args)
  local path = args[1]
  if path == nil then
    error("infer.lua: give the bodies file after --")
  end
  for line in io.lines(path) do
    if #line > 0 then
      bodies[#bodies + 1] = line
    end
  end
  if #bodies == 0 then
    error("infer.lua: no bodies in " .. path)
  end
  next_body = (offset or 0) % #bodies
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  next_body = next_body % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[next_body])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'wrk-json {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors_status": %d, "errors_connect": %d, "errors_read": %d, ' ..
    '"errors_write": %d, "errors_timeout": %d, "p50_us": %d, ' ..
    '"p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect,
    e.read, e.write, e.timeout, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.max))
end
