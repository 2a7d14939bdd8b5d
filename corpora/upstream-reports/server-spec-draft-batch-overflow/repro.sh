#!/bin/sh
# qwen3next: llama-server dies of SIGABRT during requests: tools/server/server-context.cpp:508: GGML_ASSERT(add_ok && "batch must be large enough to hold the sampled and draft tokens") failed.
#
# llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f: llama-server (LLAMA_SERVER, else the one on PATH) on the model beside this
# file, sent the requests below. Exits 1 while the defect is present (llama-server dies of a signal), 0 once
# it is fixed (it answers them and still runs), 2 when it cannot run (no llama-server, no curl).
server=${LLAMA_SERVER:-llama-server}
port=${PORT:-18182}
dir=$(cd "$(dirname "$0")" && pwd)
command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }
log=$(mktemp); slots=$(mktemp -d)  # what llama-server printed; where it saves slots
GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" --slot-save-path "$slots" -np 2 -c 1024 --cache-ram 64 -b 256 -ub 256 -t 1 -tb 1 --no-webui --no-warmup -fit off --spec-type draft-simple -md "$dir/model.gguf" --spec-draft-n-max 5 --spec-draft-n-min 0 --spec-draft-p-min 0.0 -ctxcp 3 -cms 8192 -b 8 -ub 8 >"$log" 2>&1 &
pid=$!; i=0
until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
  kill -0 $pid 2>/dev/null || { echo "cannot run: llama-server exited as it started; see $log"; exit 2; }
  i=$((i + 1)); [ $i -lt 600 ] || { kill $pid; echo "cannot run: llama-server did not start"; exit 2; }
  sleep 0.1
done
post() {  # POST $2 to $1 (a server that dies answers nothing)
  curl -s -X POST "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2"
}

post /completion '{"prompt":[2,4,3,5,5,0,1,0,5,6,0,1,5,2,2,2,5,6,7,2,3,5,0,3,2,1,2,1],"n_predict":6,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null 2>&1 & posts="$posts $!"
post /completion '{"prompt":[2,7,2,7,2,7,2,7,2,7,2,7,2,7,2,7,2,7,2,7,2,7,2,7,3,3],"n_predict":6,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false,"n_cmpl":2}' >/dev/null 2>&1 & posts="$posts $!"
post /completion '{"prompt":[2,4,3,5,5,0,1,0,5,6,0,1,5,2,2,2,5,6,7,2,3,0,7,0,2,4,3,0,0],"n_predict":6,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null 2>&1 & posts="$posts $!"
wait $posts; posts=""
sleep 0.5

if ! kill -0 $pid 2>/dev/null; then
  wait $pid; rc=$?
  if [ $rc -gt 128 ]; then echo "DEFECT: llama-server was killed by signal $((rc - 128)) during the requests"; exit 1; fi
  echo "cannot run: llama-server exited ($rc) during the requests; see $log"; exit 2
fi
kill $pid; wait $pid 2>/dev/null; echo "fixed: llama-server answered the requests and still runs"; exit 0
