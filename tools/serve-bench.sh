#!/usr/bin/env bash
# Aggregate decode throughput of `coli serve` and of the peer's `llama-server` on the same GGUF,
# at several concurrencies, on the GPU machine (docs/BENCHMARKS.md). Run from the checkout's
# root with the release binary in devbin/coli, the Vulkan loader packages in .gl/ and a copy of
# ../shared/peers in devbin/peers (all git-ignored, carried by the device tool):
#   bash tools/serve-bench.sh olmoe Q8_0 "1 4 16 64" [tokens]
# Each level: N clients at once, each one completion of `tokens` tokens (EOS ignored, greedy),
# timed from the first request sent to the last answer; tok/s = completion tokens / seconds.
# TTFT: the first streamed chunk of one request on an idle server; then 4 requests of 256 tokens,
# untimed, to bring the GPU's clock up, and each level's batch of 16-token requests, untimed,
# so that neither server is timed building kernels for a batch size. REPS (default 2) alternations;
# WAIT (default 600) seconds for a server to come up.
set -uo pipefail
arch=${1:-olmoe}; q=${2:-Q8_0}; levels=${3:-"1 4 16 64"}; tokens=${4:-128}
P=devbin/peers; COLI=${COLI:-devbin/coli}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for x in $P/bin/*.xz; do [ -f "${x%.xz}" ] || python3 -c "import lzma,sys;open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$x" "${x%.xz}"; done
chmod +x $P/bin/* "$COLI"
M=/tmp/$arch
if [ ! -f "$M-$q.gguf" ]; then
  [ -f "$M-bf16.gguf" ] || python3 $P/make_gguf.py --gguf-py $P/gguf-py --arch "$arch" --out "$M-bf16.gguf"
  $P/bin/llama-quantize "$M-bf16.gguf" "$M-$q.gguf" "$q" 16 >/dev/null
fi
max=$(echo $levels | tr ' ' '\n' | sort -n | tail -1)

load() { # url levels tokens
  python3 - "$@" <<'EOF'
import json, sys, threading, time, urllib.request
url, levels, tokens = sys.argv[1], [int(x) for x in sys.argv[2].split()], int(sys.argv[3])
def post(body, stream=False):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)
# TTFT on an idle server, streamed.
t0 = time.time()
with post({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}) as r:
    r.readline()
    ttft = time.time() - t0
    r.read()
print(f"ttft_ms {ttft * 1000:.1f}")
# Two seconds or so of load before the timed levels: a GPU's clock follows its load, and a level
# of one stream right after an idle spell ran at the idle clock (docs/BENCHMARKS.md, 2026-12-07).
# Then each level's batch once, untimed: a server that builds its kernels for a batch size at
# its first use (the peer's first 4-stream level took 5.7 s on a fresh machine) is timed warm.
def burst(n, tokens):
    ts = [threading.Thread(target=lambda: post({"prompt": "Warm up", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}).read()) for _ in range(n)]
    for t in ts: t.start()
    for t in ts: t.join()
burst(4, 256)
for n in levels:
    burst(n, 16)
def counters():
    # coli's step counters (llama-server has none of these names): {} where absent.
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except Exception:
        return {}
    names = ("steps_total", "step_seconds_total", "device_wait_seconds_total", "device_record_seconds_total")
    return {n: float(l.split()[1]) for l in text.splitlines() for n in names if l.startswith(f"coli_{n} ")}
for n in levels:
    before = counters()
    got = [0] * n
    def one(i):
        body = {"prompt": f"Story {i}: once upon a time there was", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        with post(body) as r:
            got[i] = json.load(r)["usage"]["completion_tokens"]
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.time() - t0
    print(f"streams {n} tokens {sum(got)} secs {dt:.2f} aggregate_tok_s {sum(got) / dt:.1f}")
    after = counters()
    if after and before:
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        steps = max(d.get("steps_total", 0.0), 1.0)
        print(f"  steps {steps:.0f}: {1e3 * d['step_seconds_total'] / steps:.2f} ms a step, of which waiting for the "
              f"device {1e3 * d['device_wait_seconds_total'] / steps:.2f} ms and recording "
              f"{1e3 * d['device_record_seconds_total'] / steps:.2f} ms")
EOF
}

# A fresh machine compiles the peer's shaders at its first start: wait up to WAIT seconds.
wait_up() {
  for _ in $(seq 1 $((2 * ${WAIT:-600}))); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "not up: $1"; tail -5 /tmp/*.log; return 1
}

for rep in $(seq 1 "${REPS:-2}"); do
  echo "== llama-server -np $max (Vulkan), $arch $q, rep $rep"
  $P/bin/llama-server -m "$M-$q.gguf" -ngl 99 -fa on -np "$max" -c $((max * 1024)) --port 8091 >/tmp/peer.log 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:8091 && load http://127.0.0.1:8091 "$levels" "$tokens"
  kill $pid; wait $pid 2>/dev/null
  echo "== coli serve --parallel $max (Vulkan), $arch $q, rep $rep"
  "$COLI" serve -q --model "$M-$q.gguf" --device vulkan --parallel "$max" --ctx 1024 --port 8092 >/tmp/coli.log 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:8092 && load http://127.0.0.1:8092 "$levels" "$tokens"
  kill $pid; wait $pid 2>/dev/null
done
if [ -n "${CPU_LEVELS:-}" ]; then
  echo "== coli serve --parallel $max (CPU, $(nproc) cores), $arch $q"
  "$COLI" serve -q --model "$M-$q.gguf" --device cpu --parallel "$max" --ctx 1024 --port 8093 >/tmp/coli-cpu.log 2>&1 &
  pid=$!
  wait_up http://127.0.0.1:8093 && load http://127.0.0.1:8093 "$CPU_LEVELS" "${CPU_TOKENS:-32}"
  kill $pid; wait $pid 2>/dev/null
fi
