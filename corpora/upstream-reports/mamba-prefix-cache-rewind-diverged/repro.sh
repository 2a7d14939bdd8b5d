#!/bin/sh
# mamba: llama-server answers a request otherwise than the same prompt with nothing cached (rewind-diverged; state of an earlier conversation).
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

start -np 1 -c 1024 --cache-ram 64 -b 256 -ub 256 -t 1 -tb 1 --no-webui --no-warmup -fit off
post /completion '{"prompt":[30,20,21,28,18,24],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[30,20,26,7,1],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[9,9,27,29,0,15],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[9,9,27,26,4,25],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[3,14,26,9,10,8],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[3,14,26,9,23,8,31],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[14,15,16,18,17,16],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[14,15,16,18,17,16,31,25,25,22,19,10],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[14,15,16,18,17,16,31,25,25,31,14,6],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[27,5,27,19,3,1],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[27,5,27,19,3,1,14,1,4,16,31,14],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[27,5,27,19,3,1,14,1,4,16,31,14,7,25,29,26,20,14],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[27,5,27,19,3,1,14,1,4,16,31,14,16,8,15,12],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[7,31,0,3,6,31,22,28],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[7,31,6,23,11],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[15,0,19,26,21,4,17,8],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[15,0,19,30,28,5],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[16,30,27,22,20,1,23,15],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[16,30,27,22,2,7,17],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[23,16,19,27,21,11,20,19],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[23,16,19,27,21,11,3,1,21],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[12,19,10,7,4,12,26,12],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[12,19,10,7,4,12,26,12,12,18,31,12,18,14],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[12,19,10,7,4,12,26,12,12,18,31,19,14,20],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[17,21,30,4,17,14,11,7],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[17,21,30,4,17,14,11,7,1,12,26,3,12,30],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[17,21,30,4,17,14,11,7,1,12,26,3,12,30,12,30,6,0,21,0],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[17,21,30,4,17,14,11,7,1,12,26,3,12,30,9,15,27,2],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
post /completion '{"prompt":[21,17,4,27,27,15,30,19,28,30,18,8],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' >/dev/null
got=$(post /completion '{"prompt":[21,17,4,18,6],"n_predict":1,"cache_prompt":true,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' | tokens)
stop

# the reference: the same prompt alone, nothing cached
start -np 1 -c 1024 --cache-ram 0 --no-webui --no-warmup -fit off
want=$(post /completion '{"prompt":[21,17,4,18,6],"n_predict":1,"cache_prompt":false,"n_probs":2,"temperature":0.0,"top_k":1,"seed":0,"ignore_eos":true,"return_tokens":true,"stream":false}' | tokens)
stop
[ -n "$want" ] || { echo "cannot run: no answer from the reference"; exit 2; }
if [ "$got" != "$want" ]; then
  echo "DEFECT: the last request is answered [$got]; the same prompt, nothing cached, [$want]"; exit 1
fi
echo "fixed: the last request is answered [$got], as the same prompt with nothing cached"
exit 0
