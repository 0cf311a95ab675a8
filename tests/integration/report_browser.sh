#!/usr/bin/env bash
# report_browser.sh REFIT RECIPES WORK_DIR
# Trains a short fp16-mixed run (gradient scaler, skipped updates, evaluations), checks the run
# report it writes (report.html: self-contained, every plot present; metrics.csv: one row per
# update and evaluation), rebuilds both with `refit report`, then opens report.html in headless
# Chromium: it must load without console errors or failed requests, and its screenshot must not
# be blank. Exit 77 (ctest: skipped) when no Chromium is installed (Debian: apt install chromium).
set -u
refit="$1"; recipes="$2"; work="$3"
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"; mkdir -p "$work"
run="$work/run"
"$refit" train "$recipes/fp16-mixed-scaler.json" --set training.duration=60:step --set training.eval_every=20:step \
  --set output.dir="$run" > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "refit train failed"; }
report="$run/report.html"
[ -f "$report" ] || fail "no report.html after refit train"
[ -f "$run/metrics.csv" ] || fail "no metrics.csv after refit train"

# Self-contained: no script, no stylesheet or image fetched, no URL but the SVG namespace.
grep -Eqi '<script|<link|<img|<iframe|src=|href=|@import|url\(' "$report" && fail "report.html loads something"
grep -Eo 'https?://[^"'"'"' )]*' "$report" | grep -v '^http://www.w3.org/2000/svg$' && fail "report.html names a URL"
for id in loss metric-accuracy lr grad-norm loss-scale throughput; do
  grep -q "<figure id='$id'>" "$report" || fail "report.html has no plot '$id'"
done
grep -q "class='skip'" "$report" || fail "skipped updates are not marked"
for section in Summary Environment Evaluations Plots Recipe; do
  grep -q "<h2>$section</h2>" "$report" || fail "report.html has no section $section"
done
grep -q '<th>precision</th><td>fp16-mixed</td>' "$report" || fail "the environment does not name the precision"
grep -q '&quot;duration&quot;: &quot;60:step&quot;' "$report" || fail "the recipe (with its overrides) is not in the report"
# Ticks with labels on both axes of every plot.
[ "$(grep -c "class='xlabel'" "$report")" -ge 6 ] || fail "x axis tick labels missing"

# metrics.csv: a header, then one row per logged update and evaluation.
updates=$(grep -c '"kind":"train"' "$run/metrics.jsonl"); evals=$(grep -c '"kind":"eval"' "$run/metrics.jsonl")
[ "$updates" -eq 30 ] || fail "expected 30 updates in metrics.jsonl, got $updates"
[ "$evals" -ge 3 ] || fail "expected at least 3 evaluations, got $evals"
rows=$(($(wc -l < "$run/metrics.csv") - 1))
[ "$rows" -eq $((updates + evals)) ] || fail "metrics.csv has $rows rows, expected $((updates + evals))"
head -1 "$run/metrics.csv" | grep -q '^kind,split,step,iteration,epoch,samples,time,loss,lr_' || fail "metrics.csv header"
grep -q '^eval,val,20,10,' "$run/metrics.csv" || fail "metrics.csv: no val row at step 20"

# refit report rebuilds both from the folder.
rm "$report" "$run/metrics.csv"
"$refit" report "$run" || fail "refit report failed"
[ -f "$report" ] && [ -f "$run/metrics.csv" ] || fail "refit report did not write report.html and metrics.csv"

browser=""
for b in chromium chromium-browser google-chrome; do command -v "$b" >/dev/null && { browser="$b"; break; }; done
if [ -z "$browser" ]; then echo "SKIP: no Chromium (apt install chromium) to render report.html"; exit 77; fi
flags=(--headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" --enable-logging=stderr --v=0)
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$report" > "$work/dom.html" 2> "$work/dom.log" \
  || { cat "$work/dom.log"; fail "$browser --dump-dom failed"; }
grep -E 'CONSOLE|Uncaught|Failed to load|Refused|net::ERR' "$work/dom.log" && fail "console errors while loading report.html"
figures=$(grep -o '<figure id=' "$report" | wc -l)
[ "$(grep -o '<svg class="chart"' "$work/dom.html" | wc -l)" -eq "$figures" ] || fail "the DOM does not hold every plot"
timeout 120 "$browser" "${flags[@]}" --hide-scrollbars --window-size=1000,2600 --screenshot="$work/report.png" \
  "file://$report" > "$work/shot.log" 2>&1 || { cat "$work/shot.log"; fail "$browser --screenshot failed"; }
grep -E 'CONSOLE|Uncaught|Failed to load|Refused|net::ERR' "$work/shot.log" && fail "console errors while rendering report.html"
size=$(stat -c %s "$work/report.png" 2>/dev/null || echo 0)
[ "$size" -gt 40000 ] || fail "screenshot $work/report.png is $size bytes: blank?"
echo "report.html renders in $browser: $figures plots, screenshot $work/report.png ($size bytes)"
