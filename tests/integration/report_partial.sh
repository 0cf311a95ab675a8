#!/usr/bin/env bash
# report_partial.sh REFIT WORK_DIR
# `refit report` on the folder of a run that did not finish (metrics.jsonl only): non-finite
# values (null in JSON), a skipped update, a resume (the time starts again) and an evaluation with
# a null metric still give a report, which says the run did not finish; a broken line is an error
# naming the file and line.
set -u
refit="$1"; work="$2"
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"; mkdir -p "$work"
{
  echo '{"kind":"train","step":1,"iteration":1,"epoch":0,"samples":8,"time":0.5,"loss":2.0,"lr":[0.1,0.01],"grad_norm":3.0,"grad_norm_clipped":1.0,"scale":1.0,"scale_after":1.0,"skipped":false,"skipped_total":0}'
  echo '{"kind":"train","step":2,"iteration":2,"epoch":0,"samples":16,"time":1.0,"loss":null,"lr":[0.1,0.01],"grad_norm":null,"grad_norm_clipped":null,"scale":1.0,"scale_after":1.0,"skipped":true,"skipped_total":1}'
  echo '{"kind":"eval","split":"val","step":2,"iteration":2,"count":4,"loss":1.5,"accuracy":null}'
  echo '{"kind":"train","step":3,"iteration":3,"epoch":0,"samples":24,"time":0.4,"loss":1.8,"lr":[0.09,0.009],"grad_norm":2.0,"grad_norm_clipped":1.0,"scale":1.0,"scale_after":1.0,"skipped":false,"skipped_total":1}'
} > "$work/metrics.jsonl"
"$refit" report "$work" || fail "refit report failed on an unfinished run"
grep -q 'no summary.json: the run did not finish' "$work/report.html" || fail "the report does not say the run did not finish"
grep -q "class='skip'" "$work/report.html" || fail "the skipped update is not marked"
grep -q '>group 1<' "$work/report.html" || fail "no learning-rate series for the second group"
[ "$(wc -l < "$work/metrics.csv")" -eq 5 ] || fail "metrics.csv: expected a header and 4 rows"
grep -q '^train,,2,2,0,16,1,,0.1,0.01,,,1,1,1,1,' "$work/metrics.csv" || fail "metrics.csv: the skipped row"
echo 'not json' >> "$work/metrics.jsonl"
out=$("$refit" report "$work" 2>&1) && fail "a broken metrics.jsonl line was accepted"
grep -q 'metrics.jsonl:5: not a JSON object' <<<"$out" || fail "the error does not name the line: $out"
echo "ok"
