#!/usr/bin/env bash
# Give ManiSkill/SAPIEN a Vulkan device on a Linux machine without an NVIDIA GPU.
#
# ManiSkill needs Vulkan even for state observations. Debian 12's own lavapipe (Mesa 22.3) is
# rejected by SAPIEN; Mesa 25's lavapipe from bookworm-backports works. This script fetches it
# WITHOUT installing anything system-wide: apt runs with private state/cache directories, the
# .debs are unpacked under $VENV/vulkan, and a patched ICD json points at the unpacked driver.
#
#   scripts/setup_vulkan.sh [VENV] [--force]
#     VENV     the virtual environment to put it in (default: $VENV or the repo's .venv)
#     --force  fetch again even when already set up (otherwise idempotent: returns at once)
#   DEBIAN_MIRROR=http://mirror/debian scripts/setup_vulkan.sh
#
# Result, in $VENV/vulkan/:
#   lvp_icd.json  the lavapipe ICD with an absolute library_path
#   root/         the unpacked packages (usr/lib/<multiarch>/libvulkan_lvp.so, libdrm*, ...)
#   env.sh        exports VK_ICD_FILENAMES, VK_DRIVER_FILES, LD_LIBRARY_PATH, XDG_RUNTIME_DIR
# Python code does not need env.sh: envs.vulkan.ensure_vulkan_env() activates the same setup
# in-process before SAPIEN is imported (and worker processes inherit it).
#
# With an NVIDIA GPU (or on a non-Linux machine) it does nothing: the driver's own ICD is used.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -*) echo "usage: $0 [VENV] [--force]" >&2; exit 2 ;;
        *) VENV="$arg" ;;
    esac
done
VENV="${VENV:-$ROOT/.venv}"

log() { echo "[setup_vulkan] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$VENV"
VENV="$(cd "$VENV" && pwd)"  # absolute: the ICD json needs an absolute library path
DEST="$VENV/vulkan"

if [[ "$(uname -s)" != Linux ]]; then
    log "not Linux: nothing to do"; exit 0
fi
if [[ -e /proc/driver/nvidia/version ]] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    log "NVIDIA GPU found: SAPIEN uses the NVIDIA driver's Vulkan ICD; nothing to do"; exit 0
fi
if [[ $FORCE == 0 && -f "$DEST/env.sh" && -f "$DEST/lvp_icd.json" ]]; then
    lib="$(sed -nE 's/.*"library_path": *"([^"]*)".*/\1/p' "$DEST/lvp_icd.json")"
    if [[ -f "$lib" ]]; then log "already set up in $DEST"; exit 0; fi
fi

# shellcheck disable=SC1091
. /etc/os-release
CODENAME="${VERSION_CODENAME:-}"
[[ "${ID:-}" == debian && -n "$CODENAME" ]] || die "this script fetches Mesa from Debian ${CODENAME:-bookworm}-backports and needs Debian (found ${PRETTY_NAME:-unknown}). Elsewhere install Mesa >= 24 lavapipe (mesa-vulkan-drivers) and the Vulkan loader (libvulkan1) with the system's package manager."
command -v apt-get >/dev/null || die "apt-get not found"

# The machine's own Debian mirror (first deb822 URIs line of a stanza for $CODENAME, or a
# one-line 'deb' entry), so this works behind the same proxy/mirror as the rest of apt.
mirror="${DEBIAN_MIRROR:-}"
if [[ -z "$mirror" ]]; then
    mirror="$(awk -v c="$CODENAME" 'BEGIN{RS=""} $0 ~ "Suites:[^\n]*[ ]" c "([ \n]|$)" && $0 !~ /debian-security/ {
        if (match($0, /URIs:[ ]*[^ \n]+/)) { u=substr($0, RSTART, RLENGTH); sub(/URIs:[ ]*/, "", u); print u; exit } }' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
fi
if [[ -z "$mirror" && -f /etc/apt/sources.list ]]; then
    mirror="$(awk -v c="$CODENAME" '$1=="deb" { for (i=2;i<=NF;i++) if ($i !~ /^\[/ && $i ~ /^[a-z]+:/) { if ($(i+1)==c) { print $i; exit } } }' /etc/apt/sources.list || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$keyring" ]] || die "$keyring not found (package debian-archive-keyring)"

APT_DIR="$DEST/apt"
rm -rf "$APT_DIR" "$DEST/debs"
mkdir -p "$APT_DIR/sources.list.d" "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/prefs.d" "$DEST/debs"
cat > "$APT_DIR/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $CODENAME $CODENAME-backports
Components: main
Signed-By: $keyring
EOF
APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
     -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
     -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=$APT_DIR/prefs.d"
     -o "APT::Sandbox::User=$(id -un)" -o "Debug::NoLocking=1")

log "fetching package lists of $CODENAME and $CODENAME-backports from $mirror (private apt dirs)"
apt-get "${APT[@]}" -qq update || die "apt-get update failed (is $mirror reachable?)"

BPO="$CODENAME-backports"
pkgs=("mesa-vulkan-drivers/$BPO" "libdrm2/$BPO" "libdrm-amdgpu1/$BPO")
if ! ldconfig -p | grep -q 'libvulkan\.so\.1 '; then
    log "no system Vulkan loader (libvulkan.so.1): fetching libvulkan1 too"
    pkgs+=(libvulkan1)
fi
# Any other runtime dependency of the driver that this machine lacks (minimal containers).
depends="$(apt-cache "${APT[@]}" show "mesa-vulkan-drivers/$BPO" | sed -n 's/^Depends: //p' | head -1)"
IFS=',' read -ra deps <<< "$depends"
for dep in "${deps[@]}"; do
    name="$(echo "$dep" | sed -E 's/^ *//; s/[ (|].*//; s/:any$//')"
    case "$name" in libvulkan1|libdrm2|libdrm-amdgpu1|"") continue ;; esac
    if ! dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed"; then
        log "missing dependency $name: fetching it too"
        pkgs+=("$name")
    fi
done

log "downloading ${pkgs[*]}"
(cd "$DEST/debs" && apt-get "${APT[@]}" -qq download "${pkgs[@]}") || die "apt-get download failed"

rm -rf "$DEST/root"
mkdir -p "$DEST/root"
for deb in "$DEST"/debs/*.deb; do
    dpkg-deb -x "$deb" "$DEST/root"
done

MULTIARCH="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")"
LIBDIR="$DEST/root/usr/lib/$MULTIARCH"
[[ -f "$LIBDIR/libvulkan_lvp.so" ]] || die "libvulkan_lvp.so not found in the unpacked packages ($LIBDIR)"
icd_src="$(find "$DEST/root/usr/share/vulkan/icd.d" -name 'lvp_icd*.json' | head -1)"
[[ -n "$icd_src" ]] || die "lavapipe ICD json not found in the unpacked packages"
sed -E "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$LIBDIR/libvulkan_lvp.so\"#" "$icd_src" > "$DEST/lvp_icd.json"

# Only lavapipe is used: drop the hardware drivers and layers of the same package (~50 MB).
find "$LIBDIR" -maxdepth 1 \( -name 'libvulkan_*.so' ! -name 'libvulkan_lvp.so' -o -name 'libVkLayer_*.so' \) -delete
missing="$(LD_LIBRARY_PATH="$LIBDIR" ldd "$LIBDIR/libvulkan_lvp.so" | grep 'not found' || true)"
[[ -z "$missing" ]] || die "the driver still misses libraries: $missing"

mkdir -p "$DEST/xdg" && chmod 700 "$DEST/xdg"
cat > "$DEST/env.sh" <<EOF
# Generated by scripts/setup_vulkan.sh: Mesa lavapipe (software Vulkan) for SAPIEN/ManiSkill.
# Python code need not source this (envs.vulkan.ensure_vulkan_env() does the same in-process).
export VK_ICD_FILENAMES="$DEST/lvp_icd.json"
export VK_DRIVER_FILES="$DEST/lvp_icd.json"
export LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export XDG_RUNTIME_DIR="\${XDG_RUNTIME_DIR:-$DEST/xdg}"
EOF
rm -rf "$APT_DIR" "$DEST/debs"
version="$(sed -nE 's/.*"api_version": *"([^"]*)".*/\1/p' "$DEST/lvp_icd.json")"
log "lavapipe (Vulkan $version) ready in $DEST"

# Self-check when SAPIEN is installed in the venv: create the render device.
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('sapien') is None)" 2>/dev/null; then
    if (cd "$ROOT" && "$VENV/bin/python" -c "from envs.vulkan import ensure_vulkan_env; ensure_vulkan_env(); import sapien; sapien.render.RenderSystem()" >/dev/null 2>&1); then
        log "self-check passed: SAPIEN created a Vulkan render device"
    else
        die "self-check failed: SAPIEN could not create a render device with $DEST/lvp_icd.json"
    fi
fi
