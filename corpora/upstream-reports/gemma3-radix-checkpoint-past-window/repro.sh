#!/bin/sh
# gemma3: llama-server answers a request otherwise than the same prompt with nothing cached (diverged; cause not localized).
#
# llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f: llama-server (LLAMA_SERVER, else the one on PATH) on the model beside this
# file, sent the requests below one after another; its answer to the last against the same prompt's from a
# llama-server that caches nothing (one slot, --cache-ram 0, cache_prompt false). Exits 1 while they differ
# (the defect), 0 once they agree, 2 when it cannot run (no llama-server, no curl, a request failed).
server=${LLAMA_SERVER:-llama-server}
port=${PORT:-18181}
dir=$(cd "$(dirname "$0")" && pwd)
command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }
log=$(mktemp); slots=$(mktemp -d)  # what llama-server printed; where it saves slots
start() {  # llama-server with these flags, once it answers /health
  GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" --slot-save-path "$slots" "$@" >"$log" 2>&1 &
  pid=$!; i=0
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    kill -0 $pid 2>/dev/null || { echo "cannot run: llama-server exited as it started; see $log"; exit 2; }
    i=$((i + 1)); [ $i -lt 600 ] || { kill $pid; echo "cannot run: llama-server did not start"; exit 2; }
    sleep 0.1
  done
}
stop() { kill $pid 2>/dev/null; wait $pid 2>/dev/null; }
post() {  # POST $2 to $1
  curl -sf -X POST "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2" || { echo "cannot run: a request to $1 failed; see $log"; stop; exit 2; }
}
tokens() { sed -n 's/.*"tokens":\[\([^]]*\)\].*/\1/p'; }

start -np 2 -c 320 --cache-ram 64 -b 256 -ub 256 -t 1 -tb 1 --no-webui --no-warmup -fit off
post /completion '{"prompt":[54,40,32,17,19,2,4,48,46,54,11,5,55,1,34,5,19,30,27],"n_predict":8,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false,"id_slot":0}' >/dev/null
post /completion '{"prompt":[54,40,32,17,19,2,4,1,11,52,41,58,32,38,62,46,40,34,35,59,17],"n_predict":8,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false,"id_slot":1}' >/dev/null
got=$(post /completion '{"prompt":[54,40,32,17,19,2,4,48,46,54,11,5,55,1],"n_predict":8,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false,"id_slot":1}' | tokens)
stop

# the reference: the same prompt alone, nothing cached
start -np 1 -c 320 --cache-ram 0 --no-webui --no-warmup -fit off
want=$(post /completion '{"prompt":[54,40,32,17,19,2,4,48,46,54,11,5,55,1],"n_predict":8,"cache_prompt":false,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' | tokens)
stop
[ -n "$want" ] || { echo "cannot run: no answer from the reference"; exit 2; }
if [ "$got" != "$want" ]; then
  echo "DEFECT: the last request is answered [$got]; the same prompt, nothing cached, [$want]"; exit 1
fi
echo "fixed: the last request is answered [$got], as the same prompt with nothing cached"
exit 0
