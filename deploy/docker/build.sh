#!/bin/sh
# build.sh: the image's build steps, kept out of the Dockerfile so they can be
# run (and tested) on a machine without a container engine.
#
#   build.sh deps                 apt-get install the build dependencies
#   build.sh build DESTDIR        make, then make install DESTDIR=.. PREFIX=/usr/local
#   build.sh runtime-packages     print the runtime Debian packages, one a line
#   build.sh runtime-deps         apt-get install the runtime packages (slim image)
#   build.sh check-runtime BIN    fail unless every shared library BIN needs
#                                 comes from a runtime package (or libc6)
#
# Environment: IMAGE_BUILD=1 (remove apt's lists after installing), BUILD_DIR
# (make's object dir, default build; the test points it at a temp dir so it
# never touches the work tree's build/), JOBS (make -j).
set -eu

# Debian bookworm names. The -dev packages mirror the Makefile's PKGS
# (rdkafka hiredis jansson libmicrohttpd uuid openssl libpq libcurl lua5.1); the runtime list is what the
# binary links against. check-runtime keeps the second honest.
BUILD_PKGS="build-essential pkg-config librdkafka-dev libhiredis-dev libjansson-dev libmicrohttpd-dev uuid-dev libssl-dev libpq-dev libcurl4-openssl-dev liblua5.1-0-dev"
RUNTIME_PKGS="librdkafka1 libhiredis0.14 libjansson4 libmicrohttpd12 libuuid1 libssl3 libpq5 libcurl4 liblua5.1-0 ca-certificates"

die() {
    echo "build.sh: $*" >&2
    exit 1
}

apt_install() {
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
    # Images should not carry the package lists.
    if [ -n "${IMAGE_BUILD:-}" ]; then
        $sudo rm -rf /var/lib/apt/lists/*
    fi
}

# Package owning a shared library path; usrmerge means dpkg may know it under
# /usr/lib or /lib, whichever the package shipped.
owner_of() {
    lib=$1
    for p in "$lib" "/usr$lib" "${lib#/usr}"; do
        out=$(dpkg -S "$p" 2>/dev/null) && {
            echo "$out" | head -n 1 | cut -d: -f1
            return 0
        }
    done
    real=$(readlink -f "$lib")
    [ "$real" != "$lib" ] && owner_of "$real" && return 0
    return 1
}

cmd=${1:-}
case "$cmd" in
deps)
    # shellcheck disable=SC2086
    apt_install $BUILD_PKGS
    ;;
runtime-packages)
    for p in $RUNTIME_PKGS; do echo "$p"; done
    ;;
runtime-deps)
    # shellcheck disable=SC2086
    apt_install $RUNTIME_PKGS
    ;;
build)
    [ $# -eq 2 ] || die "usage: build.sh build DESTDIR"
    destdir=$2
    src=$(cd "$(dirname "$0")/../.." && pwd)
    builddir=${BUILD_DIR:-build}
    jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
    # DEB_PKGS is narrowed to the build dependencies: the Makefile's
    # deps-check would otherwise install the test and demo tools (criterion,
    # redis, kcat, prometheus) into the build stage.
    make -C "$src" -j"$jobs" BUILD="$builddir" DEB_PKGS="$BUILD_PKGS" \
        "$builddir/idemproc"
    make -C "$src" BUILD="$builddir" DEB_PKGS="$BUILD_PKGS" \
        DESTDIR="$destdir" PREFIX=/usr/local install
    "$destdir/usr/local/bin/idemproc" --version
    echo "runtime packages:"
    for p in $RUNTIME_PKGS; do echo "  $p"; done
    ;;
check-runtime)
    [ $# -eq 2 ] || die "usage: build.sh check-runtime BIN"
    bin=$2
    [ -x "$bin" ] || die "$bin: not an executable"
    # Direct dependencies only (NEEDED): their own dependencies come with the
    # runtime packages through apt.
    needed=$(LC_ALL=C readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    [ -n "$needed" ] || die "$bin: no NEEDED entries (static binary?)"
    bad=0
    for so in $needed; do
        case "$so" in
        libasan.so.* | libubsan.so.* | liblsan.so.* | libtsan.so.*)
            # a sanitizer build (make SAN=...): never what an image ships
            echo "$so (sanitizer runtime, not for images)"
            continue
            ;;
        esac
        path=$(ldd "$bin" | awk -v so="$so" '$1 == so { print $3 }')
        [ -n "$path" ] && [ "$path" != "not" ] || {
            echo "check-runtime: $so: not found by ldd" >&2
            bad=1
            continue
        }
        pkg=$(owner_of "$path") || {
            echo "check-runtime: $so ($path): no Debian package owns it" >&2
            bad=1
            continue
        }
        case "$pkg" in
        libc6) ok=1 ;; # in every Debian image
        *)
            ok=0
            for p in $RUNTIME_PKGS; do [ "$p" = "$pkg" ] && ok=1; done
            ;;
        esac
        if [ "$ok" -eq 1 ]; then
            echo "$so $pkg"
        else
            echo "check-runtime: $so comes from $pkg, which is not in RUNTIME_PKGS" >&2
            bad=1
        fi
    done
    exit $bad
    ;;
*)
    die "usage: build.sh deps|build DESTDIR|runtime-packages|runtime-deps|check-runtime BIN"
    ;;
esac
