#!/usr/bin/env bash
# The evidence studies still to run, in order (done: balance.py lm-tiers, evidence.py
# lm-tiers-iid; their results are in benchmarks/results/), each resumable: a cut-off study picks up where it stopped
# (compare's --resume keeps every finished run whose config is the same by value). Runs go to
# runs/evidence/ of the folder this is started from; results to benchmarks/results/.
#
#   benchmarks/studies.sh --start      # in the background, from a worktree of HEAD (edit main meanwhile)
#   benchmarks/studies.sh --pause      # stop the queue's processes for a while (a timing that wants idle cores) ...
#   benchmarks/studies.sh --continue   # ... and let them go on
#   benchmarks/studies.sh --drain      # start no more runs: the queue ends when the runs in flight have finished
#   benchmarks/studies.sh --stop       # end the queue, pack the finished runs, remove the worktree
#   benchmarks/studies.sh --list       # what it would run, in order
#   benchmarks/studies.sh --status     # the runs in flight, and how many runs of each study are done
#   nohup benchmarks/studies.sh >> /tmp/studies.log 2>&1 &    # the queue itself, in the foreground's folder
#
# --start runs the queue from a git worktree of HEAD ($STUDIES_WORKTREE, default /tmp/shoal-studies) whose
# runs/evidence is this checkout's, so the committed code runs while this checkout changes; the worktree's
# .queue.pgid holds the queue's process group, which the other commands signal. Log: $STUDIES_LOG.
# The queue runs at the lowest CPU priority (nice 19): tests, CI and edits take the cores first and run at
# nearly full speed beside it, and a sim run's results are in virtual time, so they do not depend on the load.
#
# A study takes longer than a session, and runs/ is not tracked: at the end of a session pack the finished runs
# into git (`benchmarks/run_archive.py save`, then commit benchmarks/archive/); this script unpacks them first, so
# a fresh checkout goes on where the last one stopped.
#
# Two runs at a time (--jobs 2: this machine's two cores). A study's results file is written when all its
# runs are done; write it at a clean commit (its JSON records the commit and whether the tree was dirty).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(pwd)/.venv/bin/python}"
STUDIES=(
  "lowcomm.py lm-1g"                 # issue 40 again: Streaming DiLoCo now cuts tensors at equal fragment boundaries
  "lowcomm.py shapes-1g"             # issue 40 on the image workload
  "grid_edges.py lowcomm-shapes-1g"  # each kept grid end's next value out, on the development seeds (lm-1g: done)
  "sim_signal.py shapes"             # issue 40: SIM's signal on the image workload (12 BSP runs that measure it)
  "balance.py shapes-tiers"          # issue 39 on the image workload: issue 38's six baselines + balanced BSP
  "evidence.py shapes-tiers-iid"     # issue 38 on the image workload (every run shared with the one above)
  "balance.py lm-lognormal"          # issue 39, and issue 38's lm-lognormal-iid baselines
  "evidence.py lm-lognormal-iid"     # issue 38 (every run shared with the one above)
  "balance.py shapes-lognormal"      # issue 39 on the lognormal cluster: issue 38's six baselines + balanced BSP
  "evidence.py shapes-lognormal-iid" # issue 38 (every run shared with the one above)
  "evidence.py lm-tiers-by_source"   # issue 38: non-IID
  "evidence.py lm-tiers-compression" # issue 38: compression and GRID in training
  "evidence.py shapes-tiers-dirichlet" # issue 38: the image workload on non-IID shards
)
WORKTREE="$(realpath -m "${STUDIES_WORKTREE:-/tmp/shoal-studies}")"
LOG="${STUDIES_LOG:-/tmp/studies.log}"
PGID_FILE="$WORKTREE/.queue.pgid"

alive() {  # whether process group $1 holds a process that is not a zombie (ended, not yet reaped)
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

queue_group() {  # the running queue's process group, or nothing
  [[ -s "$PGID_FILE" ]] && alive "$(cat "$PGID_FILE")" && cat "$PGID_FILE"
}

in_flight() {  # a run folder with events written in the last 10 minutes and no summary yet is in progress
  local events dir t
  find runs/evidence -name metrics.jsonl -mmin -10 2>/dev/null | sort | while read -r events; do
    dir=$(dirname "$events")
    [[ -e "$dir/summary.json" ]] && continue
    # how far it is: the virtual time of its last event (a restarted run rewrites its folder, so no wall age)
    t=$(tail -n 1 "$events" | grep -o '"t": [0-9.]*' | head -n 1 | cut -d' ' -f2)
    echo "  in flight: ${dir#runs/evidence/} (at ${t%%.*} s of virtual time)"
  done
}

nice_session() {  # nice 19 for the scheduling group of session $1 once its leader has left ours (setsid)
  local _
  for _ in $(seq 50); do
    if [[ "$(ps -o sid= -p "$1" | tr -d ' ')" == "$1" ]]; then echo 19 2>/dev/null > "/proc/$1/autogroup" || true; return; fi
    sleep 0.1
  done
}

case "${1:-}" in
  --start)
    if group=$(queue_group); then
      echo "error: the queue already runs (process group $group, $WORKTREE); --stop it first" >&2
      exit 2
    fi
    git worktree prune
    if [[ -e "$WORKTREE" ]]; then  # a queue that ended (or was ended with the machine's session) left it behind
      if ! git worktree list --porcelain | grep -x "worktree $WORKTREE" > /dev/null; then  # no -q: no SIGPIPE
        echo "error: $WORKTREE exists and is not a worktree of this checkout; remove it or set STUDIES_WORKTREE" >&2
        exit 2
      fi
      echo "the last queue's worktree $WORKTREE is left from a queue no longer running: removing it (its runs are in runs/evidence)"
      git worktree remove --force "$WORKTREE"
    fi
    git worktree add --quiet --detach "$WORKTREE" HEAD
    mkdir -p runs/evidence "$WORKTREE/runs"
    ln -sfn "$(pwd)/runs/evidence" "$WORKTREE/runs/evidence"
    # setsid: the queue leads its own process group, so one signal reaches every run it started. nice 19 (see
    # above) for the process and for its session's scheduling group: with autogroup scheduling (Linux's default on
    # desktops and here) a new session gets its own group, whose share only the group's nice lowers
    (cd "$WORKTREE" || exit 2; PYTHON="$PYTHON" setsid nice -n 19 benchmarks/studies.sh >> "$LOG" 2>&1 < /dev/null &
     echo $! > "$PGID_FILE")
    nice_session "$(cat "$PGID_FILE")"
    echo "queue started at $(git rev-parse --short HEAD) in $WORKTREE (process group $(cat "$PGID_FILE")); log: $LOG"
    exit 0 ;;
  --pause|--continue)
    group=$(queue_group) || { echo "error: no queue runs from $WORKTREE" >&2; exit 2; }
    kill "-$([[ "$1" == --pause ]] && echo STOP || echo CONT)" -- "-$group"
    echo "queue ${1#--}d (process group $group)"
    exit 0 ;;
  --drain)  # each study folder's STOP: its comparison starts no more runs, lets those in flight end, exits 130
    group=$(queue_group) || { echo "error: no queue runs from $WORKTREE" >&2; exit 2; }
    for folder in runs/evidence/*/; do touch "$folder/STOP"; done
    touch "$WORKTREE/.drain"  # and the queue starts no further study (a comparison removes a spent STOP)
    echo "queue drains (process group $group): no run starts, it ends when the runs in flight have; then --stop"
    exit 0 ;;
  --stop)
    if group=$(queue_group); then
      kill -TERM -- "-$group"; kill -CONT -- "-$group" 2>/dev/null || true  # a paused run takes TERM once it goes on
      for _ in $(seq 30); do alive "$group" || break; sleep 1; done
      kill -KILL -- "-$group" 2>/dev/null || true
    fi
    PYTHONPATH=src "$PYTHON" benchmarks/run_archive.py save
    [[ -e "$WORKTREE" ]] && git worktree remove --force "$WORKTREE"
    git worktree prune
    echo "queue stopped; commit benchmarks/archive/ to keep its finished runs"
    exit 0 ;;
esac
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${STUDIES[@]}"
  exit 0
fi
if [[ "${1:-}" == "--status" ]]; then  # whether the queue runs, how far each study is, then a total
  if group=$(queue_group); then
    paused=$(ps -eo pgid=,stat= | awk -v g="$group" '$1 == g && $2 ~ /^T/ { n++ } END { print n + 0 }')
    share=$(grep -o 'nice -\?[0-9]*' "/proc/$group/autogroup" 2>/dev/null || echo "nice ?")
    echo "queue: running at $(git -C "$WORKTREE" rev-parse --short HEAD) in $WORKTREE (process group $group, $share$(
      [[ $paused -gt 0 ]] && echo ", paused")$([[ -e "$WORKTREE/.drain" ]] && echo ", draining: no run starts"))"
    in_flight  # so a drain can be timed: each run in progress, and how far it is
  else
    echo "queue: not running from $WORKTREE (--start starts it)"
  fi
  for study in "${STUDIES[@]}"; do
    read -r script name <<< "$study"
    PYTHONPATH=src "$PYTHON" "benchmarks/$script" --list | grep "^$name: " || echo "$name: (no progress line)"
  done | awk '  # each line, then the hours left, counted once per runs folder (studies that share runs share it)
    { print }
    match($0, /in runs\/evidence\/[^;]+/) { folder = substr($0, RSTART, RLENGTH) }
    match($0, /about [0-9.]+ h left/) { h = substr($0, RSTART + 6, RLENGTH - 13); if (h > left[folder]) left[folder] = h }
    END { for (f in left) total += left[f]
          printf "queue: about %.1f h left at two runs at a time (a study not started is guessed from its workload'"'"'s other runs)\n", total }'
  exit 0
fi
PYTHONPATH=src "$PYTHON" benchmarks/run_archive.py restore
for study in "${STUDIES[@]}"; do
  if [[ -e .drain ]]; then echo "== $(date -u +%FT%TZ) drained: no further study starts"; exit 0; fi
  echo "== $(date -u +%FT%TZ) benchmarks/$study"
  # shellcheck disable=SC2086  # the script and the study name are two words
  PYTHONPATH=src "$PYTHON" benchmarks/$study --jobs 2 --resume
done
