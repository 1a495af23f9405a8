#!/usr/bin/env bash
# A stand-in for the Dockerfile's base image, for machines that cannot pull it (no image
# registry reachable): Debian bookworm minbase with Debian's Python 3.11 in place of the
# official image's own build, and what python:3.11-slim-bookworm has besides (its shared
# libpython, the C headers, ca-certificates, netbase, tzdata, `python` on the PATH) but no
# compiler or libc headers, as there. Tagged with the name the Dockerfile's FROM uses.
#
#   tests/image/standin_base.sh python:3.11-slim-bookworm
#
# Only the image test calls this, and only when `podman pull` of the real image failed.
set -euo pipefail
name=${1:?usage: standin_base.sh IMAGE_NAME}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/recserve-standin.XXXXXX)
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=ca-certificates,netbase,tzdata \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
# Python afterwards with apt: debootstrap's own pass fails configuring python3.11-venv.
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The official image's headers and libpython3.11.so link, without the -dev packages'
# dependencies (libc6-dev, libexpat1-dev, ...): a build that needs libc headers must
# install them itself, as on the real base.
chroot "$root" sh -ec '
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends python3.11 python3.11-venv libpython3.11 >/dev/null
    cd /tmp
    apt-get download -q libpython3.11-dev python3.11-dev >/dev/null
    for deb in ./*.deb; do dpkg-deb -x "$deb" /; done
    rm -f ./*.deb
    ln -sf /usr/bin/python3.11 /usr/local/bin/python
    ln -sf /usr/bin/python3.11 /usr/local/bin/python3
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /var/log/apt/*
'
rm -f "$root/etc/resolv.conf"
tar -C "$root" -c . | podman import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$name" >/dev/null
echo "built stand-in base $name ($(podman image inspect --format '{{.Size}}' "$name") bytes)"
