#!/usr/bin/env bash
# memcheck.sh BIN: `make demo` with every idemproc process (broker, members,
# produce, verify) under valgrind memcheck, for `make memcheck` and CI.
# Exit 0 only when the demo passes and every process reported 0 errors and
# 0 bytes definitely lost. MEMCHECK_COUNT records (default 5000).
set -euo pipefail
BIN=${1:-build/idemproc}
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
command -v valgrind >/dev/null || { echo "memcheck: valgrind not found (make deps)" >&2; exit 2; }
DIR=$(mktemp -d "${TMPDIR:-/tmp}/idemproc-memcheck.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
# The wrapper the demo runs instead of the binary: one log per process.
cat >"$DIR/idemproc" <<WRAP
#!/bin/sh
exec valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \\
    --errors-for-leak-kinds=definite --show-leak-kinds=definite \\
    --log-file="$DIR/vg.%p.log" "$BIN" "\$@"
WRAP
chmod +x "$DIR/idemproc"
rc=0
DEMO_COUNT=${MEMCHECK_COUNT:-5000} DEMO_DEADLINE_S=${MEMCHECK_DEADLINE_S:-240} \
    "$(dirname "$0")/demo.sh" "$DIR/idemproc" || rc=$?
logs=("$DIR"/vg.*.log)
bad=0
for f in "${logs[@]}"; do
    cmd=$(grep -m1 -o 'Command: .*' "$f" | cut -c10- | cut -d' ' -f2)
    errs=$(grep -o 'ERROR SUMMARY: [0-9]*' "$f" | grep -o '[0-9]*$' || echo '?')
    lost=$(grep -o 'definitely lost: [0-9,]* bytes' "$f" | grep -o '[0-9,]* bytes' || echo '0 bytes')
    echo "memcheck: $cmd: $errs errors, definitely lost $lost"
    if [[ $errs != 0 || $lost != "0 bytes" ]]; then
        bad=1
        sed -n '/Invalid\|uninitialised\|definitely lost in/,/^==[0-9]*== $/p' "$f" | head -60
    fi
done
((${#logs[@]} >= 5)) || { echo "memcheck: only ${#logs[@]} valgrind logs" >&2; bad=1; }
((rc == 0)) || echo "memcheck: the demo failed (exit $rc)" >&2
((rc == 0 && bad == 0)) && echo "memcheck: OK (${#logs[@]} processes)"
exit $((rc != 0 || bad != 0))
