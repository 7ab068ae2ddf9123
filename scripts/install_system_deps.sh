#!/usr/bin/env bash
# The system packages some tests run against for real, from Debian: Slurm and munge
# (tests/integration/test_slurm.py), Prometheus (tests/integration/test_observability.py).
# Needs root and apt-get; without them it says so and the tests that need them skip.
# With CI=true a failed install is an error: CI must run those tests.
set -uo pipefail
PACKAGES=(slurm-wlm munge prometheus)
have() { command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged \
         && command -v prometheus; } >/dev/null
if have; then
    echo "system packages: already installed (${PACKAGES[*]})"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "system packages: not root or no apt-get: the Slurm and Prometheus tests will skip"
    [ "${CI:-}" = true ] && exit 1
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
for attempt in 1 2 3; do
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" \
            >/dev/null; then
        break
    fi
    echo "system packages: attempt $attempt failed; trying again" >&2
    sleep $((attempt * 5))
done
if have; then
    echo "system packages: installed ${PACKAGES[*]}"
    exit 0
fi
echo "system packages: could not install ${PACKAGES[*]}" >&2
[ "${CI:-}" = true ] && exit 1
exit 0
