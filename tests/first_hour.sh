#!/usr/bin/env bash
# first_hour: runs the README's own session, block by block, as a new user
# would, and checks every output the README shows.
#
# usage: tests/first_hour.sh IDEMPROC_BIN [README]
#
# The README marks each such block with a line `<!-- first-hour -->` right
# before a ```console fence. In a block, a line starting with "$ " is a
# command (it continues over `\` line ends, open quotes and here-documents);
# the lines after it, up to the next command, are its expected output. Each
# expected line must match an output line, in order (other lines may come
# between); `...` matches anything, and the elapsed time and rate of
# produce's summary are not compared. A command without expected output must
# exit 0. A command ending in `&` runs in the background, as a job of the
# same shell (so `kill %3` means what it means in a terminal); when the
# README shows its output (the broker's bootstrap line), the test waits for
# it.
#
# The README's example addresses are replaced with what this run uses: the
# broker's bootstrap line 127.0.0.1:39145 with the real one, Redis' port
# 6379 and the HTTP ports 9464 and 9465 with free ports, build/idemproc with
# the binary under test, build/hooksink with the one next to it. Everything runs in a temp dir; every background job
# is stopped at the end, also on failure.
set -u

BIN=${1:?usage: first_hour.sh IDEMPROC_BIN [README]}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
# The tests' HTTP service, built next to the binary (make test and make
# build/idemproc-e2e build it).
HOOKSINK=$(dirname "$BIN")/hooksink
README=${2:-$(dirname "$0")/../README.md}
[[ -r $README ]] || { echo "first_hour: cannot read $README" >&2; exit 2; }
if grep -q 'build/hooksink' "$README" && [[ ! -x $HOOKSINK ]]; then
    echo "first_hour: $HOOKSINK is missing (make build/idemproc-e2e or make test builds it)" >&2
    exit 2
fi
README=$(cd "$(dirname "$README")" && pwd)/$(basename "$README")
W=$(mktemp -d /tmp/idemproc-first-hour.XXXXXX)

EXAMPLE_BOOT=127.0.0.1:39145
BOOT=$EXAMPLE_BOOT

cleanup() {
    local pids
    pids=$(jobs -p)
    if [[ -n $pids ]]; then
        kill -TERM $pids 2>/dev/null
        for _ in $(seq 100); do
            kill -0 $pids 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL $pids 2>/dev/null
        wait 2>/dev/null
    fi
    if [[ ${FIRST_HOUR_KEEP:-} ]]; then
        echo "first_hour: kept $W" >&2
    else
        rm -rf "$W"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# When this script is killed outright (SIGKILL: nothing runs its EXIT
# trap), a watchdog stops what the README's commands started. It is
# disowned so that it takes no job number (`kill %3` must mean the third
# README job).
(
    trap '' TERM INT
    while kill -0 $$ 2>/dev/null; do sleep 1; done
    if [[ -f $W/pids ]]; then
        pids=$(cat "$W/pids")
        kill -TERM $pids 2>/dev/null
        sleep 3
        kill -KILL $pids 2>/dev/null
        rm -rf "$W"
    fi
) >/dev/null 2>&1 &
disown

fail() {
    echo "first_hour: FAIL: $*" >&2
    for f in "$W"/*.log; do
        [[ -f $f ]] && { echo "--- $(basename "$f") (last 15 lines)"; tail -15 "$f"; } >&2
    done
    exit 1
}

# Ports on 127.0.0.1 nobody listens on right now, below the kernel's
# ephemeral range, where the broker's random ports and every client's
# source ports come from.
EPHEMERAL_LO=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
[[ $EPHEMERAL_LO =~ ^[0-9]+$ && $EPHEMERAL_LO -gt 12000 ]] || EPHEMERAL_LO=32768
LIB_NAME=first_hour LIB_PORT_LO=10000 LIB_PORT_HI=$EPHEMERAL_LO
. "$(dirname "$0")/lib.sh"
free_port REDIS_PORT
free_port HTTP1
free_port HTTP2

# The README's example values -> this run's.
subst() {
    local s=$1
    s=${s//build\/idemproc/\"$BIN\"}
    s=${s//build\/hooksink/\"$HOOKSINK\"}
    s=${s//$EXAMPLE_BOOT/$BOOT}
    s=${s//6379/$REDIS_PORT}
    s=${s//9464/$HTTP1}
    s=${s//9465/$HTTP2}
    printf '%s' "$s"
}

# Timing fields differ from run to run.
normalize() {
    sed -E 's/elapsed [0-9.]+s, [0-9]+ msgs\/s/elapsed Ts, R msgs\/s/'
}

# An expected line as a glob: everything literal except `...`.
glob_of() {
    local s=$1 out="" c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        if [[ ${s:i:3} == "..." ]]; then
            out+="*"
            i=$((i + 2))
        elif [[ $c == [\\\*\?\[\]] ]]; then
            out+="\\$c"
        else
            out+=$c
        fi
    done
    printf '%s' "$out"
}

# check N: the expected lines of command N appear in its output, in order.
check() {
    local n=$1 want got pat found
    local -a have
    # Through a file, not a process substitution: that would set $! and a
    # README's `kill $!` would then stop it instead of the member.
    normalize <"$W/out.$n" >"$W/norm.$n"
    mapfile -t have <"$W/norm.$n"
    local at=0
    while IFS= read -r want; do
        want=$(subst "$want" | normalize)
        pat=$(glob_of "$want")
        found=0
        while ((at < ${#have[@]})); do
            got=${have[at]}
            at=$((at + 1))
            # shellcheck disable=SC2053
            if [[ $got == $pat ]]; then
                found=1
                break
            fi
        done
        ((found)) || fail "command $n: ${CMD[n]}
expected a line matching: $want
got:
$(cat "$W/out.$n")"
    done <"$W/want.$n"
}

# ---- parse the marked blocks ----------------------------------------------
CMD=()
ncmd=0
in_block=0 armed=0 cur="" heredoc=""
finish_cmd() {
    if [[ -n $cur ]]; then
        CMD[ncmd]=$cur
        : >"$W/want.$ncmd"
        ncmd=$((ncmd + 1))
        cur=""
    fi
}
# Whether the command text so far is complete shell (quotes closed, no
# trailing backslash, here-document ended).
complete() {
    [[ -z $heredoc ]] || return 1
    [[ $1 != *\\ ]] || return 1
    bash -n <<<"$1" 2>/dev/null
}
while IFS= read -r line || [[ -n $line ]]; do
    if ((!in_block)); then
        if [[ $line == "<!-- first-hour -->" ]]; then
            armed=1
        elif ((armed)); then
            [[ $line == '```console' ]] || fail "README: <!-- first-hour --> must be followed by a \`\`\`console fence"
            in_block=1 armed=0
        fi
        continue
    fi
    if [[ -n $cur ]] && ! complete "$cur"; then
        cur+=$'\n'"$line"
        if [[ -n $heredoc && $line == "$heredoc" ]]; then
            heredoc=""
        fi
        continue
    fi
    if [[ $line == '```' ]]; then
        finish_cmd
        in_block=0
        continue
    fi
    if [[ $line == '$ '* ]]; then
        finish_cmd
        cur=${line#\$ }
        if [[ $cur =~ \<\<-?[\'\"]?([A-Za-z_]+) ]]; then
            heredoc=${BASH_REMATCH[1]}
        fi
        continue
    fi
    # expected output of the last command
    finish_cmd
    ((ncmd > 0)) || fail "README: output line before any command: $line"
    printf '%s\n' "$line" >>"$W/want.$((ncmd - 1))"
done <"$README"
((!in_block)) || fail "README: a first-hour block is not closed"
finish_cmd
((ncmd >= 10)) || fail "README: only $ncmd first-hour commands found"

# ---- run them -------------------------------------------------------------
cd "$W" || exit 1
for ((i = 0; i < ncmd; i++)); do
    text=$(subst "${CMD[i]}")
    echo "first_hour: \$ ${CMD[i]%%$'\n'*}" >&2
    if [[ $text =~ \&[[:space:]]*$ ]]; then
        text=${text%&*}
        if [[ $text != *">"* ]]; then
            text+=" >\"$W/out.$i\" 2>\"$W/err.$i.log\""
        else
            : >"$W/out.$i"
        fi
        eval "$text &"
        pid=$!
        echo "$pid" >>"$W/pids"
        want_n=$(wc -l <"$W/want.$i")
        if ((want_n > 0)); then
            for _ in $(seq 300); do
                (($(wc -l <"$W/out.$i") >= want_n)) && break
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if [[ $(head -1 "$W/want.$i") == "$EXAMPLE_BOOT" ]]; then
                BOOT=$(head -1 "$W/out.$i")
                [[ -n $BOOT ]] || fail "command $i printed no bootstrap line"
            fi
            check "$i"
        fi
        sleep 0.2
        kill -0 "$pid" 2>/dev/null || fail "command $i exited at once: ${CMD[i]}
$(cat "$W/err.$i.log" 2>/dev/null)"
        continue
    fi
    eval "$text" >"$W/out.$i" 2>&1
    rc=$?
    if [[ -s $W/want.$i ]]; then
        check "$i"
    elif ((rc != 0)); then
        fail "command $i exited $rc: ${CMD[i]}
$(cat "$W/out.$i")"
    fi
done
# The README sizes its partitions so that the broker keeps every record.
if grep -h 'dropped its' "$W"/err.*.log 2>/dev/null; then
    fail "the broker dropped records in the README's session"
fi
echo "first_hour: OK: $ncmd README commands" >&2
