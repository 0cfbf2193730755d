#!/usr/bin/env bash
# Installs Debian's chromium, which the console's browser test drives
# headless (console/browser_test.go), when it is absent. The test skips
# with a message saying so when it is missing.
set -euo pipefail

if [ -n "${IDEM_CHROMIUM:-}" ] || [ -x /usr/bin/chromium ] || command -v chromium >/dev/null; then
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "services: chromium is missing and apt-get is not here: the console's browser test will skip" >&2
	exit 0
fi
echo "services: installing chromium (for the console's browser test)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; then
	echo "services: installing chromium failed: the console's browser test will skip" >&2
fi
