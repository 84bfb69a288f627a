# shellcheck shell=bash
# Sourced by tools/setup.sh and tools/check_onetbb.sh: pinned PyPI wheels kept in venvs of the
# cache, installed once. The caller defines say().
#
#   pinned_install VENV NAME "REQUIREMENTS" NOTE [new]
#
# installs REQUIREMENTS (pinned, one per word) into VENV with its python, unless the stamp
# VENV/.pipeline-NAME already records exactly them; so a second run neither downloads nor asks pip
# anything. With "new", VENV is made afresh first (whatever was there is removed). NOTE says in
# the line printed what the install is for or costs.
pinned_install() {
  local venv=$1 name=$2 requirements=$3 note=$4 new=${5:-}
  [[ "$(cat "$venv/.pipeline-$name" 2>/dev/null)" == "$requirements" ]] && return 0
  say "installing $requirements into $venv (once; $note)"
  if [[ $new == new ]]; then
    mkdir -p "$(dirname "$venv")"
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
  # shellcheck disable=SC2086  # one requirement per word
  "$venv/bin/python" -m pip install -q --no-cache-dir $requirements >&2
  echo "$requirements" >"$venv/.pipeline-$name"
}
