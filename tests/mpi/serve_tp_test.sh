#!/bin/bash
# `serve --tp-size 2` end to end (ctest serve_tp_np2): started WITHOUT mpirun, so serve launches
# `mpirun -np 2` itself; rank 0 serves and rank 1 follows its steps. Checks:
#   1. greedy completions equal those of a --tp-size 1 server (same prompts, temperature 0), and
#      so do the routed tokens per expert in /metrics (--op-metrics), all experts counted;
#   2. SIGTERM to the launcher ends every rank with status 0;
#   3. a rank that hangs (SIGSTOP) with a request in flight: the request is answered 503 with an
#      OpenAI error body, rank 0 names the stopped rank, and the job exits non-zero within
#      --rank-timeout plus a margin, leaving no process behind;
#   4. a rank that dies (SIGKILL; stopped first so the request is surely in flight): the same,
#      well within the bound (mpirun notices the death and rank 0 answers before it ends it);
#   5. the same two failures under an `mpirun -np 2 ... serve --tp-size 2` started by hand, which
#      keeps Open MPI's defaults (a rank that dies makes mpirun end the whole job: SIGCONT, then
#      SIGTERM a second later, SIGKILL a second after that);
#   6. the start-up self-check runs on every rank (/health lists them), and an op that is wrong
#      on rank 1 only (the test hook) makes serve refuse to start naming the op and rank 1;
#   7. a rank whose forward returns an error, or that hangs, during the self-check (test hooks):
#      rank 0 ends the job with status 1 within --rank-timeout, naming rank 1, nothing left.
# Usage: serve_tp_test.sh DEEPHARNESS MODEL_DIR. Exit 77 (skip) without mpirun or curl.
set -u
BIN=$1
MODEL=$2
command -v mpirun >/dev/null || { echo "skip: mpirun not found (openmpi-bin)"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl not found"; exit 77; }
[ -f "$MODEL/config.json" ] || { echo "skip: no model at $MODEL"; exit 77; }
TMP=$(mktemp -d)
PIDS=()
cleanup() {  # every server, its mpirun and its ranks (a stopped rank too)
  for p in "${PIDS[@]}"; do
    for d in $(descendants "$p"); do kill -KILL "$d" 2>/dev/null; done
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$TMP"/*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }

# A hand-started job: Open MPI's defaults, as an operator would run it.
MPIRUN=(mpirun -np 2 --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
LAUNCH=()  # what start() runs the binary under: nothing (serve starts mpirun) or "${MPIRUN[@]}"

# start NAME ARGS...: starts a server in the background, sets PORT_<NAME> and PID_<NAME>.
start() {
  local name=$1; shift
  "${LAUNCH[@]}" "$BIN" serve --model-path "$MODEL" --port 0 --threads 1 --num-kv-blocks 64 -q \
    "$@" 2>"$TMP/$name.log" &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 240); do
    local port
    port=$(grep -o 'ready on http://127.0.0.1:[0-9]*' "$TMP/$name.log" | grep -o '[0-9]*$' | head -1)
    if [ -n "$port" ]; then eval "PORT_$name=$port; PID_$name=$pid"; return 0; fi
    kill -0 "$pid" 2>/dev/null || fail "$name exited before it was ready"
    sleep 0.5
  done
  fail "$name not ready after 120 s"
}
complete() {  # complete PORT PROMPT -> the completion text (JSON string)
  curl -s --max-time 120 "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$2\", \"max_tokens\": 24, \"temperature\": 0}" | grep -o '"text":"[^"]*"'
}
# complete_raw PORT OUT: a completion; writes "STATUS BODY" to OUT.
complete_raw() {
  curl -s --max-time 120 -o "$2.body" -w '%{http_code}' "http://127.0.0.1:$1/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"prompt": "ROMEO:", "max_tokens": 24, "temperature": 0}' >"$2.code"
  echo "$(cat "$2.code") $(cat "$2.body" 2>/dev/null)" >"$2"
}
# The descendants of a pid (the launcher's mpirun and the ranks).
descendants() {
  local kids
  kids=$(ps -o pid= --ppid "$1" 2>/dev/null)
  for k in $kids; do echo "$k"; descendants "$k"; done
}

start one --tp-size 1 --op-metrics
start two --tp-size 2 --op-metrics
# 1b. Routed tokens per expert (--op-metrics) under tensor parallelism: rank 0 serves /metrics, and
# its counts must cover every expert, those rank 1 holds (--ep-size 2: experts 4-7) too. One greedy
# request of P prompt and 8 generated tokens feeds P + 7 tokens through each MoE layer, each to
# top_k experts; the counts equal one process's for the same request.
conf() { grep -o "\"$1\": *[0-9]*" "$MODEL/config.json" | grep -o '[0-9]*$'; }
TOPK=$(conf num_experts_per_tok); NEXP=$(conf n_routed_experts)
MOE_LAYERS=$(($(conf num_hidden_layers) - $(conf first_k_dense_replace)))
for name in one two; do
  port=$(eval echo "\$PORT_$name")
  curl -s --max-time 120 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0, "ignore_eos": true}' >"$TMP/$name.usage"
  curl -s --max-time 30 "http://127.0.0.1:$port/metrics" | grep '^[a-z:_]*moe_routed_tokens_total{' |
    sed 's/^[a-z:_]*moe_routed/moe_routed/' >"$TMP/$name.routed"
done
P=$(grep -o '"prompt_tokens":[0-9]*' "$TMP/two.usage" | grep -o '[0-9]*$')
[ -n "$P" ] || fail "no usage in the tp 2 reply: $(cat "$TMP/two.usage")"
want=$(((P + 7) * TOPK * MOE_LAYERS))
[ "$(wc -l <"$TMP/two.routed")" = $((NEXP * MOE_LAYERS)) ] ||
  fail "tp 2 /metrics has $(wc -l <"$TMP/two.routed") moe_routed_tokens_total series, expected $NEXP x $MOE_LAYERS"
got=$(awk '{s += $2} END {print s}' "$TMP/two.routed")
[ "$got" = "$want" ] || fail "tp 2 routed $got tokens in all, expected ($P + 7) x $TOPK x $MOE_LAYERS = $want"
upper=$(awk -v n="$NEXP" -F'[",} ]+' '$4 >= n / 2 {s += $NF} END {print s + 0}' "$TMP/two.routed")
[ "$upper" -gt 0 ] || fail "tp 2 counted no token for rank 1's experts (the test cannot tell)"
cmp -s "$TMP/one.routed" "$TMP/two.routed" ||
  fail "routed tokens per expert differ, tp 1 vs tp 2: $(diff "$TMP/one.routed" "$TMP/two.routed" | tr '\n' ' ')"
echo "ok: tp 2 routed tokens per expert equal tp 1's: $got = ($P + 7) x $TOPK x $MOE_LAYERS, $upper to rank 1's experts"
for prompt in "ROMEO:" "JULIET: O" "To be, or not"; do
  a=$(complete "$PORT_one" "$prompt")
  b=$(complete "$PORT_two" "$prompt")
  [ -n "$a" ] || fail "tp 1 gave no completion for '$prompt'"
  [ "$a" = "$b" ] || fail "'$prompt': tp 1 $a, tp 2 $b"
  echo "ok: '$prompt' -> $b (tp 1 and tp 2)"
done
RANKS=$(descendants "$PID_two")
kill -TERM "$PID_two"
for _ in $(seq 1 120); do kill -0 "$PID_two" 2>/dev/null || break; sleep 0.5; done
kill -0 "$PID_two" 2>/dev/null && fail "tp 2 still running 60 s after SIGTERM"
wait "$PID_two"; status=$?
[ "$status" = 0 ] || fail "tp 2 exited with $status after SIGTERM"
for p in $RANKS; do kill -0 "$p" 2>/dev/null && fail "process $p of the tp 2 job left behind"; done
echo "ok: SIGTERM ended every rank with status 0"

# Waits up to 20 s (a loaded machine) for every process in $RANKS to be gone; fails naming the
# ones left behind. $1: the case's name.
expect_ranks_gone() {
  local left=""
  for _ in $(seq 1 40); do
    left=""
    for p in $RANKS; do kill -0 "$p" 2>/dev/null && left="$left $p"; done
    [ -z "$left" ] && return 0
    sleep 0.5
  done
  fail "$1: processes$left left behind"
}

# fail_rank NAME STOP|KILL: starts a tp 2 server (under LAUNCH), stops rank 1, sends a request,
# then (KILL) kills rank 1 once the request runs; checks the request's 503 body, the exit status,
# that rank 0 named rank 1, and that no process is left.
fail_rank() {
  local name=$1 sig=$2
  start "$name" --tp-size 2 --rank-timeout 5
  local follower="" p
  for p in $(descendants "$(eval echo "\$PID_$name")"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
      follower=$p
    fi
  done
  [ -n "$follower" ] || fail "$name: rank 1 of the job not found"
  local pid port
  pid=$(eval echo "\$PID_$name"); port=$(eval echo "\$PORT_$name")
  RANKS=$(descendants "$pid")
  kill -STOP "$follower"
  local start_s=$SECONDS
  complete_raw "$port" "$TMP/$name.reply" &
  local client=$!
  PIDS+=("$client")
  if [ "$sig" = KILL ]; then
    sleep 1.5  # the request reaches its first step, which waits on the stopped rank
    kill -KILL "$follower"
  fi
  for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && fail "$name: the job still runs 60 s after rank 1 got SIG$sig"
  wait "$pid"; local status=$?
  local took=$((SECONDS - start_s))
  [ "$status" != 0 ] || fail "$name: the job exited 0 after rank 1 got SIG$sig"
  [ "$took" -le 25 ] || fail "$name: the job took $took s to end (bound: --rank-timeout 5 + 20)"
  wait "$client"
  local reply
  reply=$(cat "$TMP/$name.reply")
  case "$reply" in
    "503 "*'"error"'*"rank 1 (pid $follower)"*'"type":"server_error"'*) ;;
    *) fail "$name: the request in flight got '$reply', expected a 503 OpenAI error body naming rank 1 (pid $follower)" ;;
  esac
  local state="is stopped"
  [ "$sig" = KILL ] && state="has exited"
  grep -q "rank 1 (pid $follower) $state" "$TMP/$name.log" ||
    fail "$name: rank 0 did not say that rank 1 (pid $follower) $state"
  for p in $RANKS; do kill -CONT "$p" 2>/dev/null; done
  expect_ranks_gone "$name"  # mpirun ends the rest of the job
  echo "ok: rank 1 got SIG$sig: the request in flight got 503, the job ended in $took s with" \
       "status $status: $(grep -m1 -o 'rank 1 (pid [0-9]*) [a-z ]*' "$TMP/$name.log")"
}
fail_rank hang STOP
fail_rank dead KILL

# 5. The same under mpirun started by hand: Open MPI's own reaction to a dead rank (ending the
# job) must not cut rank 0 short of answering the request and naming the rank.
LAUNCH=("${MPIRUN[@]}")
fail_rank hand_hang STOP
fail_rank hand_dead KILL
# A rank that dies while nothing runs: no step waits on it, so rank 0 learns it from mpirun's
# SIGTERM (its parent's), and must still name the rank and exit non-zero before the SIGKILL.
start hand_idle --tp-size 2 --rank-timeout 5
RANKS=$(descendants "$PID_hand_idle")
for p in $RANKS; do
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && follower=$p
done
kill -KILL "$follower"
start_s=$SECONDS
for _ in $(seq 1 40); do kill -0 "$PID_hand_idle" 2>/dev/null || break; sleep 0.5; done
kill -0 "$PID_hand_idle" 2>/dev/null && fail "hand_idle: the job still runs 20 s after rank 1 died"
wait "$PID_hand_idle"; status=$?
[ "$status" != 0 ] || fail "hand_idle: mpirun exited 0 after rank 1 died"
grep -q "^error: mpirun is ending the job: a rank failed (rank 1 (pid $follower) has exited)" \
  "$TMP/hand_idle.log" || fail "hand_idle: rank 0 did not name rank 1 (pid $follower)"
expect_ranks_gone hand_idle  # a rank mpirun did not wait for is reaped by init a moment later
echo "ok: an idle rank 1 killed under a hand-started mpirun: the job ended in" \
     "$((SECONDS - start_s)) s with status $status: $(grep -m1 '^error: mpirun' "$TMP/hand_idle.log")"
LAUNCH=()

# 6. The start-up self-check under tensor parallelism: every rank checks the ops of its own slice.
start checked --tp-size 2
health=$(curl -s --max-time 30 "http://127.0.0.1:$PORT_checked/health")
case "$health" in
  *'"self_check":{'*'"ranks":[{'*'"rank":0,'*'"rank":1,'*'"state":"passed"'*) ;;
  *) fail "tp 2 /health does not report a self-check passed on ranks 0 and 1: $health" ;;
esac
kill -TERM "$PID_checked"
wait "$PID_checked" || fail "tp 2 with the self-check exited with $? after SIGTERM"
grep -q "self-check passed (all layers on each of 2 ranks" "$TMP/checked.log" ||
  fail "tp 2: no self-check line in the log"
echo "ok: the self-check passed on both ranks: $(grep -o '"self_check":{.*}' <<<"$health")"
for hook in MatMul@1 Attention@1; do
  DEEPHARNESS_TEST_SELF_CHECK_PERTURB=$hook timeout 120 "$BIN" serve --model-path "$MODEL" \
    --port 0 --threads 1 --num-kv-blocks 64 -q --tp-size 2 >"$TMP/refused.log" 2>&1
  status=$?
  op=${hook%@*}
  [ "$status" = 2 ] || fail "a wrong $op on rank 1: serve exited with $status, expected 2"
  grep -q "^error: self-check on rank 1 (pid [0-9]*): $op differs between the cpu backend and the reference backend" \
    "$TMP/refused.log" || fail "a wrong $op on rank 1: no error line naming it and rank 1"
  [ "$(grep -c '^error:' "$TMP/refused.log")" = 1 ] || fail "a wrong $op on rank 1: not one error line"
  grep -q "ready on" "$TMP/refused.log" && fail "a wrong $op on rank 1: the server became ready"
  echo "ok: a wrong $op on rank 1 refused with status 2: $(grep -o '^error: self-check on rank 1 (pid [0-9]*): [A-Za-z]* differs' "$TMP/refused.log")"
done

# 7. A rank that breaks down during the start-up self-check (the test hooks, docs/parallel.md):
# its forward returns an error (it leaves the collective sequence, so rank 0 would wait in a
# collective for ever), or it hangs (SIGSTOP). Rank 0's start-up watch must end the job with
# status 1 within --rank-timeout plus a margin, naming rank 1, never ready, nothing left behind.
MARK="tp-startup-$$"
for hook in ERROR=MatMul@1 STALL=MatMul@1; do
  start_s=$SECONDS
  env "DEEPHARNESS_TEST_SELF_CHECK_$hook" timeout 120 "$BIN" serve --model-path "$MODEL" \
    --port 0 --threads 1 --num-kv-blocks 64 -q --tp-size 2 --rank-timeout 3 \
    --served-model-name "$MARK" >"$TMP/broken.log" 2>&1
  status=$?
  took=$((SECONDS - start_s))
  [ "$status" = 1 ] || fail "$hook: serve exited with $status, expected 1"
  [ "$took" -le 45 ] || fail "$hook: serve took $took s to end (load + --rank-timeout 3 + margin)"
  grep -q "ready on" "$TMP/broken.log" && fail "$hook: the server became ready"
  if [ "${hook%%=*}" = ERROR ]; then
    pid=$(grep -o '^error: self-check on rank 1 (pid [0-9]*): MatMul at forward step 1 failed' \
          "$TMP/broken.log" | grep -o 'pid [0-9]*' | grep -o '[0-9]*')
    [ -n "$pid" ] || fail "$hook: rank 1 did not report its error"
    want="a rank exited; rank 1 (pid $pid) has exited"
  else
    want="a collective did not finish within 3 s; rank 1 (pid [0-9]*) is stopped"
  fi
  grep -q "^error: tensor-parallel start-up (the self-check): $want" "$TMP/broken.log" ||
    fail "$hook: rank 0 did not say: $want"
  [ "$(grep -c '^error: tensor-parallel' "$TMP/broken.log")" = 1 ] || fail "$hook: not one line from rank 0"
  for _ in $(seq 1 40); do pgrep -f -- "$MARK" >/dev/null || break; sleep 0.5; done
  pgrep -f -- "$MARK" >/dev/null && fail "$hook: processes left behind: $(pgrep -f -- "$MARK" | tr '\n' ' ')"
  echo "ok: $hook during the self-check: status 1 in $took s: $(grep -o '^error: tensor-parallel.*' "$TMP/broken.log")"
done
