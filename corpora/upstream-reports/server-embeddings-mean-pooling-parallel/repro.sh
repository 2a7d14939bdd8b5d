#!/bin/sh
# llama: llama.cpp aborts starting llama-server: ggml/src/ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed.
#
# llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f: llama-server (LLAMA_SERVER, else the one on PATH) started on the model beside
# this file with the flags below. Exits 1 while the defect is present (llama-server aborts as it starts), 0
# once it is fixed (it answers /health), 2 when it cannot run (no llama-server, no curl, another failure).
server=${LLAMA_SERVER:-llama-server}
port=${PORT:-18180}
dir=$(cd "$(dirname "$0")" && pwd)
command -v "$server" >/dev/null 2>&1 || { echo "cannot run: no $server (set LLAMA_SERVER)"; exit 2; }
command -v curl >/dev/null 2>&1 || { echo "cannot run: no curl"; exit 2; }
log=$(mktemp)  # what llama-server printed
GGML_NO_BACKTRACE=1 "$server" -m "$dir/model.gguf" --host 127.0.0.1 --port "$port" -np 3 -c 1024 --cache-ram 64 -b 256 -ub 256 -t 1 -tb 1 --no-webui --no-warmup -fit off --embeddings --pooling mean >"$log" 2>&1 &
pid=$!
i=0
while [ $i -lt 600 ]; do
  if ! kill -0 $pid 2>/dev/null; then
    wait $pid; rc=$?
    if [ $rc -gt 128 ]; then echo "DEFECT: llama-server was killed by signal $((rc - 128)) as it started: $(grep -m1 GGML_ASSERT "$log")"; exit 1; fi
    echo "cannot run: llama-server exited ($rc) as it started; see $log"; exit 2
  fi
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
    kill $pid; wait $pid 2>/dev/null; echo "fixed: llama-server started and answers /health"; exit 0
  fi
  sleep 0.1; i=$((i + 1))
done
kill $pid 2>/dev/null; echo "cannot run: llama-server neither started nor died in 60 s"; exit 2
