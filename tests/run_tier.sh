#!/usr/bin/env bash
# Runs one test tier's binary with a TAP report, for the Makefile's
# check and test targets (docs/testing.md, "Tiers").
#
#   tests/run_tier.sh BUILD TIER JOBS [criterion args...]
#
# The it and e2e tiers run real processes (redis-server, the embedded
# broker, members) on a shared machine, and CI runs them twice, the second
# time under the sanitizers. A test of theirs that fails is run once more,
# alone; the tier passes only when every such test passes that second
# time, and each one is named at the end of the output and in
# BUILD/test-flaky.txt as a flake to fix (its first failure stays in
# BUILD/test-TIER.tap). More than TEST_RETRY_MAX failed tests (default 2)
# are not retried: that is a breakage, not a flake. The unit tier is never
# retried. TEST_RETRY_MAX=0 turns retrying off.
set -uo pipefail

build=$1 tier=$2 jobs=$3
shift 3
bin=$build/idemproc-$tier
tap=$build/test-$tier.tap
max=${TEST_RETRY_MAX:-2}

"$bin" --jobs="$jobs" --tap="$tap" "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0
case $tier in it | e2e) ;; *) exit "$rc" ;; esac
[ "$max" -gt 0 ] || exit "$rc"

# "not ok - suite::name  (1.23s)" -> suite/name, once each.
mapfile -t failed < <(awk '/^not ok - / {print $4}' "$tap" | sed 's|::|/|' | sort -u)
if [ "${#failed[@]}" -eq 0 ]; then
    echo "test: tier $tier failed without a failed test in its report" >&2
    exit "$rc"
fi
if [ "${#failed[@]}" -gt "$max" ]; then
    echo "test: tier $tier: ${#failed[@]} tests failed; not retried (more than $max)" >&2
    exit "$rc"
fi

again=0
for t in "${failed[@]}"; do
    echo "test: tier $tier: $t failed; running it again, alone"
    if "$bin" "$@" --jobs=1 --filter="$t" --tap="$build/test-$tier-again.tap"; then
        echo "$tier $t" >>"$build/test-flaky.txt"
    else
        again=1
    fi
done
if [ "$again" -ne 0 ]; then
    echo "test: tier $tier: a failed test failed again alone" >&2
    exit 1
fi
echo "test: tier $tier passed; ${#failed[@]} flake(s), named at the end"
exit 0
