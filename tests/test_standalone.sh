#!/usr/bin/env bash
# A user's clone has nothing beside it: fails when a tracked file refers to the folder next to
# the checkout that only this project's developers and CI have (../ followed by "shared").
# Skipped (77) outside a git work tree, e.g. in an unpacked source archive.
set -u
root=${1:?usage: test_standalone.sh SOURCE_DIR}
cd "$root" || exit 1
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "skipped: $root is not a git work tree"; exit 77; }
pattern='\.\./'"shared"   # written in two parts so that this file does not match itself
hits=$(git grep -n -I -e "$pattern" -- . ':!*.zst' 2>/dev/null)
if [[ -n $hits ]]; then
  echo "tracked files refer to a folder beside the checkout, which a user's clone does not have:"
  echo "$hits"
  exit 1
fi
n=$(git ls-files | wc -l)
echo "none of $n tracked files refers to a folder beside the checkout"
