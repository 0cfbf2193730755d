#!/usr/bin/env bash
# Runs the tests of every Go module of the repository (the root module,
# idemotel, bench/peers) with the race detector. Every module runs even when
# an earlier one fails, so one run shows every failure; the script fails if
# any module failed, and ends with one line per module.
#
# Environment: GO (the go command), PKGS (the root module's packages),
# TESTFLAGS (flags for every go test, default -race -count=1 -timeout 15m).
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
PKGS=${PKGS:-./...}
read -r -a flags <<<"${TESTFLAGS:--race -count=1 -timeout 15m}"

# module directory and the packages to test in it
modules=(".|$PKGS" "idemotel|./..." "bench/peers|./...")

out=$(mktemp)
trap 'rm -f "$out"' EXIT

summary=()
failed=0
for m in "${modules[@]}"; do
	dir=${m%%|*}
	read -r -a pkgs <<<"${m#*|}"
	name=$dir
	[ "$dir" = . ] && name="root module"
	echo "== $name: go test ${flags[*]} ${pkgs[*]}"
	start=$SECONDS
	(cd "$dir" && "$GO" test "${flags[@]}" "${pkgs[@]}") 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	took=$((SECONDS - start))
	if [ "$rc" -eq 0 ]; then
		summary+=("ok    $name (${took}s)")
	else
		# The packages go test reported as failed, on the same line.
		pkgsfailed=$(grep -E '^FAIL[[:space:]]+[^[:space:]]+' "$out" | awk '{print $2}' | sort -u | paste -sd ' ')
		summary+=("FAIL  $name (exit $rc, ${took}s) ${pkgsfailed}")
		failed=1
	fi
done

echo
echo "== test summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
