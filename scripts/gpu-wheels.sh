#!/usr/bin/env bash
# Download, on a machine with network, the wheels scripts/gpu-check.sh installs on the GPU machine, which has
# none: pydantic and its dependencies for CPython 3.10 to 3.13 on manylinux x86_64 (pydantic-core is compiled,
# one wheel per Python version), and setuptools: the build backend pip needs to install this project offline,
# and what torch.compile's Inductor imports to build its C++ parts (Python 3.12+ ships without it).
#
#   bash scripts/gpu-wheels.sh [DIR]    # default .gpu-wheels, which git ignores: bring it along by hand
#                                       # (the device tool's carry option), never commit it
#
# Set PYTHON to the interpreter whose pip downloads (default python3).
set -euo pipefail
dest=${1:-.gpu-wheels}
py=${PYTHON:-python3}
pydantic=$(grep -o '"pydantic[^"]*"' pyproject.toml | tr -d '"')  # the requirement pyproject.toml states
mkdir -p "$dest"
for version in 3.10 3.11 3.12 3.13; do
  "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
    --python-version "$version" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --dest "$dest" "$pydantic"
done
"$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps --dest "$dest" "setuptools>=64"
ls "$dest"
