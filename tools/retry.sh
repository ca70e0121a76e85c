#!/usr/bin/env bash
# Run a command that downloads (a pip install) up to RETRY_TIMES times (default 4), with a
# pause that grows between tries. A registry connection that breaks mid-wheel left pip's own
# resume stuck at the same byte (CI of 6c377eb, triton 225.4/285.8 MB after 6 tries); a fresh
# command starts a fresh connection. Anything else that fails fails the same way each time, and
# costs only the tries.
# Usage: [RETRY_TIMES=N] [RETRY_PAUSE=SECONDS] tools/retry.sh COMMAND [ARG...]
set -uo pipefail
times="${RETRY_TIMES:-4}"
pause="${RETRY_PAUSE:-15}"
for ((try = 1; ; try++)); do
    "$@" && exit 0
    rc=$?
    if ((try >= times)); then
        echo "tools/retry.sh: gave up after $try tries (exit $rc): $*" >&2
        exit "$rc"
    fi
    echo "tools/retry.sh: try $try of $times failed (exit $rc), again in $((try * pause)) s: $*" >&2
    sleep $((try * pause))
done
