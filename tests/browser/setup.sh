#!/usr/bin/env bash
# Installs what tests/browser.rs needs to drive the status page in a real browser:
#   Selenium (pinned in requirements.txt) into tests/browser/.venv
# and checks that Debian's chromium and chromedriver are installed (apt-get install -y
# chromium chromium-driver): this script installs no system package itself.
# Idempotent: a second run only checks that everything is in place.
set -euo pipefail
cd "$(dirname "$0")"

command -v python3 >/dev/null 2>&1 || { echo "setup.sh: python3 is not installed" >&2; exit 1; }
for tool in chromium chromedriver; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "setup.sh: $tool is not installed (on Debian: apt-get install -y chromium chromium-driver)" >&2
    exit 1
  }
done

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
  python3 -m venv .venv || { echo "setup.sh: python3 -m venv failed (on Debian/Ubuntu: apt-get install -y python3-venv)" >&2; exit 1; }
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
.venv/bin/python -c 'import selenium; print("selenium", selenium.__version__)'
chromedriver --version
