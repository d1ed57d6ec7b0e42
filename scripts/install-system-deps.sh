#!/usr/bin/env bash
# Debian packages the project needs: git (with http-backend) for the local git servers the tests
# start, and a C compiler with OpenSSL's headers for the native corpus accelerators.
set -euo pipefail
need=()
command -v git >/dev/null 2>&1 || need+=(git)
[ -x "$(git --exec-path 2>/dev/null)/git-http-backend" ] || need+=(git)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "install as root: apt-get install ${need[*]}" >&2; exit 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
