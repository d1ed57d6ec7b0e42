#!/usr/bin/env bash
# Debian packages the test suite needs: git (with http-backend) for the local git servers.
set -euo pipefail
need=()
command -v git >/dev/null 2>&1 || need+=(git)
[ -x "$(git --exec-path 2>/dev/null)/git-http-backend" ] || need+=(git)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "install as root: apt-get install ${need[*]}" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
