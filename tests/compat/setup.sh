#!/usr/bin/env bash
# Installs the pinned client libraries that tests/compat.rs runs against the proxy:
#   redis-py and python-redis-lock (requirements.txt) into tests/compat/.venv
#   ioredis, node-redis, redlock (package-lock.json) into tests/compat/node_modules
# Idempotent: a second run only checks that everything is in place.
# Needs python3 (with venv and pip), node and npm on the PATH.
set -euo pipefail
cd "$(dirname "$0")"

for tool in python3 node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup.sh: $tool is not installed" >&2; exit 1; }
done

# Python: a virtualenv with the pinned redis-py.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
  python3 -m venv .venv || { echo "setup.sh: python3 -m venv failed (on Debian/Ubuntu: apt-get install -y python3-venv)" >&2; exit 1; }
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
.venv/bin/python -c 'import redis, redis_lock; print("redis-py", redis.__version__, "python-redis-lock", redis_lock.__version__)'

# Node: exactly what package-lock.json records. `npm ci` wipes and reinstalls node_modules,
# so it runs only when the installed tree does not match the lock file.
lock_sum=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f node_modules/.compat-lock-sum ] || [ "$(cat node_modules/.compat-lock-sum)" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_sum" > node_modules/.compat-lock-sum
fi
node -e 'for (const p of ["ioredis", "redis", "redlock"]) console.log(p, require(`./node_modules/${p}/package.json`).version)'
