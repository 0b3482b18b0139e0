#!/usr/bin/env bash
# `npm run setup` in bench/: installs, from Debian's packages, what the bench runs beside perch
# when it is missing (wrk: the load generator; nginx-light and varnish: the hit-path peers;
# redis-server: perch's rate limits in Redis; valgrind: `npm run tracing-instructions`; tcpdump:
# the hit-tail scenario's packet timing), then the bench's npm dependencies.
#
# The bench starts its own nginx, varnishd and redis-server on free 127.0.0.1 ports with temp
# dirs and kills them at the end, so the system services these packages come with must not run:
# they would listen on ports 80, 6081 and 6379 and take CPU during the runs. Starts are refused
# during the install (policy-rc.d, Debian's switch for exactly this), and whatever this script
# installed is stopped and disabled after it, in case the system starts services some other way.
set -euo pipefail
cd "$(dirname "$0")"

declare -A package_of=([wrk]=wrk [nginx]=nginx-light [varnishd]=varnish [redis-server]=redis-server [valgrind]=valgrind [tcpdump]=tcpdump)
declare -A service_of=([nginx-light]=nginx [varnish]=varnish [redis-server]=redis-server)
missing=()
for tool in wrk nginx varnishd redis-server valgrind tcpdump; do
  # nginx and varnishd live in /usr/sbin, not always on a normal user's PATH.
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("${package_of[$tool]}")
done

if [ "${#missing[@]}" -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "setup: installing ${missing[*]} with apt"
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# temporary, from perch bench/setup.sh: no service starts during the install\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    trap '"${sudo[@]}" rm -f "$policy"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  for package in "${missing[@]}"; do
    service="${service_of[$package]:-}"
    [ -n "$service" ] || continue
    if [ -d /run/systemd/system ]; then
      "${sudo[@]}" systemctl disable --now "$service" >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
      "${sudo[@]}" service "$service" stop >/dev/null 2>&1 || true
    fi
  done
fi

# Nothing may be left on the packages' default ports: the bench's figures assume quiet cores.
if command -v ss >/dev/null 2>&1; then
  listening="$(ss -Hltn '( sport = :80 or sport = :6081 or sport = :6082 )' || true)"
  if [ -n "$listening" ]; then
    echo "setup: warning: something listens on port 80/6081/6082 (a system nginx or varnish?); stop it before benchmarking:" >&2
    echo "$listening" >&2
  fi
fi

echo "setup: $(wrk --version 2>&1 | head -1 || true); $(PATH="$PATH:/usr/sbin" nginx -v 2>&1); $(PATH="$PATH:/usr/sbin" varnishd -V 2>&1 | head -1); $(redis-server --version | cut -d' ' -f1-3)"
npm ci --no-audit --no-fund
