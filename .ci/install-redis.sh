#!/usr/bin/env bash
# Installs redis-server (and redis-cli) for the Redis tests, which start their own
# private servers (internal/redistest). Idempotent: does nothing if redis-server is
# already on PATH. Does not leave a system Redis service running.
set -euo pipefail

if ! command -v redis-server >/dev/null 2>&1; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		if command -v sudo >/dev/null 2>&1; then
			sudo="sudo"
		else
			echo "install-redis.sh: redis-server is missing and installing it needs root or sudo" >&2
			exit 1
		fi
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "install-redis.sh: redis-server is missing and apt-get is unavailable; install Redis (7.x) by hand" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get update -q
	$sudo apt-get install -y -q --no-install-recommends redis-server

	# Tests start their own servers; stop and disable any service the package
	# started. In containers without systemd it usually was not started at all.
	if command -v systemctl >/dev/null 2>&1; then
		$sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
	fi
	$sudo service redis-server stop >/dev/null 2>&1 || true
fi

redis-server --version
# The store needs Redis 6 (SET ... KEEPTTL); with Redis 7 no test skips
# for an older server's missing feature.
major=$(redis-server --version | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')
if [ -z "$major" ] || [ "$major" -lt 6 ]; then
	echo "install-redis.sh: redis-server ${major:-of unknown version} is too old: the tests need Redis 6 or later (7.x to run them all)" >&2
	exit 1
fi
if [ "$major" -lt 7 ]; then
	echo "install-redis.sh: warning: redis-server $major.x: the tests of Redis 7 features skip; install Redis 7.x to run them all" >&2
fi
