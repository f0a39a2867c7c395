#!/usr/bin/env bash
# The long fuzz campaign of issue 21: every target of crates/tether-fuzz run
# by libFuzzer for RUNS executions (default 10^6) or MAX_TIME seconds,
# whichever ends first, one target after the other, on the stable toolchain.
#
#   fuzz/campaign.sh                      # all targets, 10^6 executions each
#   RUNS=20000 MAX_TIME=20 fuzz/campaign.sh canonical rpc   # a short run of two
#
# New inputs go to fuzz/corpus-run/<target> (not committed); the seeds in
# fuzz/corpus/<target> are read, never written. A crash leaves its input in
# fuzz/artifacts/<target>/ and the run of that target fails; the script goes
# on with the next target and exits 1 at the end. Logs and a summary table
# (executions, time, coverage, features, corpus, crashes per target) go to
# fuzz/campaign-out/ (not committed).
set -u
cd "$(dirname "$0")"
RUNS="${RUNS:-1000000}"
MAX_TIME="${MAX_TIME:-0}"          # 0: no time bound
JOBS_NICE="${JOBS_NICE:-10}"
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(canonical verify limits policy loader rpc rest mcp)
fi
OUT=campaign-out
mkdir -p "$OUT"
# The stable toolchain: no sanitizer (`-s none`, ASan needs nightly);
# libFuzzer's coverage instrumentation (sancov) is a stable `-C` flag.
# Built once for all targets.
nice -n "$JOBS_NICE" cargo fuzz build -s none --release >"$OUT/build.log" 2>&1 || {
  echo "build failed: $OUT/build.log"; exit 2; }
status=0
printf '| target | executions | time (s) | exec/s | cov | ft | corpus | crashes |\n|---|---|---|---|---|---|---|---|\n' >"$OUT/summary.md"
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus-run/$t" "artifacts/$t"
  start=$(date +%s)
  nice -n "$JOBS_NICE" cargo fuzz run -s none --release "$t" "corpus-run/$t" "corpus/$t" -- \
    -runs="$RUNS" -max_total_time="$MAX_TIME" -max_len=4096 -timeout=60 -rss_limit_mb=3072 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$OUT/$t.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$' | tail -1)
  last=$(grep -E '#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$OUT/$t.log" | tail -1)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*')
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*')
  corp=$(echo "$last" | grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' | sed 's/corp: //')
  # Only what this run left: artifacts of earlier runs stay until removed.
  crashes=$(find "artifacts/$t" -type f -newermt "@$start" | wc -l)
  [ "$rc" -ne 0 ] && status=1
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$t" "${execs:-?}" "$secs" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" >>"$OUT/summary.md"
done
cat "$OUT/summary.md"
exit $status
