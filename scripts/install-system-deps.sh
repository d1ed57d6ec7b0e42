#!/usr/bin/env bash
# Debian packages the project needs: git (with http-backend) for the local git servers the tests
# start, a C compiler with OpenSSL's headers for the native corpus accelerators, and for the execution
# tests: openssh-server (sshd), iproute2 (network namespaces), docker.io (dockerd) and busybox-static
# (the tiny base image the tests import), docker-compose (to validate docker-compose.yml). Only what is
# missing is installed; nothing is started.
set -euo pipefail
need=()
command -v git >/dev/null 2>&1 || need+=(git)
[ -x "$(git --exec-path 2>/dev/null)/git-http-backend" ] || need+=(git)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keyscan >/dev/null 2>&1 || need+=(openssh-client)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "install as root: apt-get install ${need[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq -o DPkg::Lock::Timeout=600
  # The tests start their own sshd and dockerd (own ports and sockets), whether or not the system ones run.
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null
fi
