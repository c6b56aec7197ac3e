#!/usr/bin/env bash
# Model-check the lock and slot protocol (tests/model/protocol.pml) and concurrency
# groups (tests/model/groups.pml: the checks named groups-*) with spin.
#
#   bash scripts/model.sh            every check in CHECKS
#   bash scripts/model.sh races      only the checks named (CHECKS or LONG)
#   bash scripts/model.sh --long     every check in CHECKS, then those in LONG
#
# Each check generates pan with `spin -a`, compiles it with gcc and runs it, in a
# temporary directory (never in the repository), and prints one line: states, depth,
# memory, time and errors. A "holds" check fails unless spin explores every state
# (no bitstate) and finds no error; a "refuted" check (a mutant of the protocol, or a
# known gap) fails unless spin finds a counterexample, which is printed as a trail:
# which server sent which statement at which tick of the database clock.
# A check in LONG takes minutes and up to 12 GB: run with --long, or by name.
# Exit status: 0 when every check went as expected, 1 otherwise, 2 without spin/gcc.
# docs/model.md explains the model, the properties and the figures.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODEL="$ROOT/tests/model/protocol.pml"

# name | expected | spin -D options
CHECKS=(
    "races|holds|-DNS=3 -DNJ=2 -DSTARTS=1 -DFAULTS=0 -DFORCE=0"
    "faults|holds|-DNS=3 -DNJ=1 -DSTARTS=1 -DFAULTS=1 -DFORCE=1"
    "restarts|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0"
    "buffer-faults|holds|-DNS=3 -DNJ=1 -DSTARTS=1 -DFAULTS=1 -DFORCE=1 -DBUFFER=1"
    "buffer-restarts|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DBUFFER=1"
    "slots|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DNK=4"
    "buffer-slots|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DBUFFER=1 -DNK=4"
    "allow-all-faults|holds|-DNS=3 -DNJ=1 -DSTARTS=1 -DFAULTS=1 -DFORCE=1 -DDISTURBANCES=1 -DALLOW_ALL=1"
    "allow-all-restarts|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DALLOW_ALL=1"
    "allow-all-slots|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DALLOW_ALL=1 -DNK=4"
    "buffer-all-faults|holds|-DNS=3 -DNJ=1 -DSTARTS=1 -DFAULTS=1 -DFORCE=1 -DBUFFER=2"
    "buffer-all-slots|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DBUFFER=2 -DNK=4"
    "buffer-all-chain|holds|-DNS=1 -DNJ=1 -DSTARTS=3 -DFAULTS=1 -DFORCE=1 -DBUFFER=2 -DNK=5"
    "buffered-reached|refuted|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=0 -DFORCE=0 -DBUFFER=1 -DREACH_BUFFERED"
    "take-ignores-expiry|refuted|-DNS=3 -DNJ=1 -DFAULTS=1 -DFORCE=1 -DMUTANT_TAKE_IGNORES_EXPIRY"
    "release-not-holder-checked|refuted|-DNS=3 -DNJ=1 -DFAULTS=1 -DFORCE=1 -DMUTANT_RELEASE_NOT_HOLDER_CHECKED"
    "claim-not-unique|refuted|-DNS=3 -DNJ=1 -DFAULTS=0 -DFORCE=1 -DMUTANT_CLAIM_NOT_UNIQUE"
    "no-watchdog|refuted|-DNS=3 -DNJ=1 -DFAULTS=1 -DFORCE=1 -DMUTANT_NO_WATCHDOG"
    "claim-writes-apart|refuted|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DNK=4 -DMUTANT_CLAIM_WRITES_APART"
    "first-run-unguarded|refuted|-DNS=3 -DNJ=1 -DFAULTS=1 -DFORCE=1 -DMUTANT_FIRST_UNGUARDED"
    "left-reached|refuted|-DNS=1 -DNJ=1 -DSTARTS=3 -DFAULTS=0 -DFORCE=0 -DBUFFER=2 -DNK=5 -DREACH_LEFT"
    "buffer-all-records-ahead|refuted|-DNS=1 -DNJ=1 -DSTARTS=2 -DFAULTS=0 -DFORCE=0 -DBUFFER=2 -DNK=5 -DMUTANT_BUFFER_ALL_RECORDS_AHEAD"
    "slots-out-of-turn|refuted|-DNS=2 -DNJ=1 -DSTARTS=1 -DFAULTS=0 -DFORCE=0 -DALLOW_ALL=1 -DMUTANT_SLOTS_OUT_OF_TURN"
    "groups-restarts|holds|-DNS=2 -DSTARTS=2 -DFAULTS=1 -DFORCE=0"
    "groups-three|holds|-DNS=3 -DSTARTS=1 -DFAULTS=1 -DFORCE=0"
    "groups-force|holds|-DNS=2 -DSTARTS=2 -DFAULTS=1 -DFORCE=1"
    "groups-busy-reached|refuted|-DNS=2 -DSTARTS=2 -DFAULTS=0 -DFORCE=0 -DREACH_BUSY"
    "groups-guard-own-lease|refuted|-DNS=2 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DMUTANT_GUARD_OWN_LEASE"
)
LONG=(
    "jobs-faults|holds|-DNS=3 -DNJ=2 -DSTARTS=1 -DFAULTS=1 -DFORCE=1 -DDISTURBANCES=1"
    "buffer-all-long|holds|-DNS=2 -DNJ=1 -DSTARTS=2 -DFAULTS=1 -DFORCE=0 -DBUFFER=2 -DNK=5"
)

for tool in spin gcc; do
    if ! command -v "$tool" >/dev/null; then
        echo "model.sh: $tool is not installed (Debian: apt-get install spin gcc)" >&2
        exit 2
    fi
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/exclusive-jobs-model.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

long=0
wanted=()
for arg in "$@"; do
    if [ "$arg" = --long ]; then long=1; else wanted+=("$arg"); fi
done
selected() { # selected NAME IS-LONG
    if [ ${#wanted[@]} -eq 0 ]; then
        [ "$2" = 0 ] || [ "$long" = 1 ]
        return
    fi
    local name
    for name in "${wanted[@]}"; do [ "$name" = "$1" ] && return 0; done
    return 1
}

value() { # value SED-REGEX FILE: what the regex's group matches on its first line
    sed -nE "s/$1/\\1/p" "$2" | head -1
}

failed=0
ran=0
for check in "${CHECKS[@]/%/|0}" "${LONG[@]/%/|1}"; do
    IFS='|' read -r name expected defines is_long <<<"$check"
    selected "$name" "$is_long" || continue
    ran=$((ran + 1))
    dir="$WORK/$name"
    mkdir -p "$dir"
    model="$MODEL"
    if [[ "$name" == groups-* ]]; then model="$ROOT/tests/model/groups.pml"; fi
    cp "$model" "$dir/protocol.pml"  # the name the steps below use
    # shellcheck disable=SC2086  # the -D options are words
    (cd "$dir" && spin -a $defines protocol.pml >spin.out 2>&1) || {
        echo "$name: spin -a failed:"; cat "$dir/spin.out"; failed=1; continue
    }
    # A holds check: exhaustive (no bitstate), each state stored whole and as it is
    # (-DNOCOMP: no byte masking; 25% less CPU for a third more memory: at most 2.5 GB
    # here). A refuted check: breadth first (the shortest counterexample), found in
    # under a second: gcc's -O1 compiles pan in 1.6 s instead of -O2's 3.6.
    if [ "$expected" = holds ]; then
        search="-DNOCOMP" optimise="-O2"
    else
        search="-DBFS" optimise="-O1"
    fi
    limits="-DMEMLIM=4096" hash=""
    if [ "$is_long" = 1 ]; then
        # Up to 12 GB (jobs-faults: 9 GB, 124 s of CPU; stored compressed with
        # -DCOLLAPSE it took 3 GB and 200 s, with -DNOCOMP 12.6 GB and 96 s: this
        # 24-GB machine runs tests beside it); a fixed hash table of 2^27 slots (1 GB)
        # and no resizing; no proctype byte in each stored state (-DNOFIX: every process
        # here keeps its place and its proctype for the whole run, so its index says it)
        search=""
        limits="-DMEMLIM=12000 -DNO_RESIZE -DNOFIX" hash="-w27"
    fi
    # shellcheck disable=SC2086
    (cd "$dir" && gcc $optimise -w -DSAFETY $search $limits -o pan pan.c) || {
        echo "$name: gcc failed"; failed=1; continue
    }
    # shellcheck disable=SC2086
    (cd "$dir" && ./pan -m500000 -n $hash >pan.out 2>&1) || true
    out="$dir/pan.out"
    errors="$(value '.*errors: ([0-9]+).*' "$out")"
    states="$(value '^ *([0-9.e+]+) states, stored.*' "$out")"
    depth="$(value '.*depth reached ([0-9]+).*' "$out")"
    memory="$(value '^ *([0-9.]+)[[:space:]]+(total actual memory usage|memory usage \(Mbyte\)).*' "$out")"
    seconds="$(value '^pan: elapsed time ([0-9.e+]+) seconds.*' "$out")"
    printf '%s (%s): %s errors, %s states, depth %s, %s MB, %s s  [%s]\n' \
        "$name" "$expected" "${errors:-?}" "${states:-?}" "${depth:-?}" "${memory:-?}" \
        "${seconds:-?}" "$defines"
    if [ "$expected" = holds ]; then
        if [ "${errors:-1}" != 0 ] || grep -q "Search not completed" "$out"; then
            echo "$name: FAILED: the model must hold, exhaustively"
            grep -E "assertion violated|invalid end state|Search not completed|MEMLIM" "$out" || true
            if [ -f "$dir/protocol.pml.trail" ]; then
                # shellcheck disable=SC2086
                (cd "$dir" && spin -t $defines protocol.pml) | grep "MSC:" | sed -E 's/^ *MSC: //'
            fi
            failed=1
        fi
    else
        if [ "${errors:-0}" = 0 ] || [ ! -f "$dir/protocol.pml.trail" ]; then
            echo "$name: FAILED: spin found no counterexample"
            failed=1
        else
            echo "  counterexample (t = the database clock; S0..S2 the servers):"
            # shellcheck disable=SC2086
            (cd "$dir" && spin -t $defines protocol.pml) | grep "MSC:" \
                | sed -E 's/^ *MSC: //; s/^/    /'
        fi
    fi
done

if [ "$ran" -eq 0 ]; then
    echo "model.sh: no check named ${wanted[*]}" >&2
    exit 1
fi
exit "$failed"
