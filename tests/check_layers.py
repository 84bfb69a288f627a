#!/usr/bin/env python3
"""Holds every #include of the tree against its layers.

The folders, from the ground floor up: base/ < graph/ and datasets/ < model/ < stages/ < runner/
< tools/ (tests/ may include anything). Inside datasets/ and model/ the rooms and what each may
include come from the build's rooms.txt (cmake/rooms.cmake writes it from the rooms' libraries,
which are declared bottom-up, so their graph has no cycle): a room may include its own files,
the rooms below it (and theirs, transitively), base/ and datasets/dataset_error.h, the data
layer's floor. An include that goes up a layer, or sideways into a room not below, fails the test
with the file, the line and the rule.

usage: check_layers.py SOURCE_DIR ROOMS_TXT
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = {".h", ".hpp", ".cpp", ".cu", ".cc"}
# Folders above the rooms, and the folders each may include.
FOLDERS = {
    "base": {"base"},
    "graph": {"base", "graph"},
    "stages": {"base", "graph", "datasets", "model", "stages"},
    "runner": {"base", "graph", "datasets", "model", "stages", "runner"},
    "tools": {"base", "graph", "datasets", "model", "stages", "runner", "tools"},
}


def read_rooms(path):
    rooms = {}
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        room, _, below = line.partition(":")
        rooms[room.strip()] = set(below.split())
    return rooms


def closure(rooms):
    """Each room's rooms below it, transitively."""
    out = {}

    def below(room, seen):
        if room in out:
            return out[room]
        if room in seen:
            raise SystemExit(f"rooms.txt: a cycle through {room}")
        acc = set()
        for b in rooms[room]:
            acc |= {b} | below(b, seen | {room})
        out[room] = acc
        return acc

    for r in rooms:
        below(r, set())
    return out


def room_of(path, rooms):
    """The room a repository path lies in ("model/net"), or None."""
    parts = path.split("/")
    if len(parts) >= 3 and "/".join(parts[:2]) in rooms:
        return "/".join(parts[:2])
    return None


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    rooms = read_rooms(sys.argv[2])
    below = closure(rooms)
    problems = []
    checked = 0
    for file in sorted(root.rglob("*")):
        if file.suffix not in SOURCES or not file.is_file():
            continue
        rel = file.relative_to(root).as_posix()
        top = rel.split("/")[0]
        if top not in FOLDERS and top not in ("datasets", "model"):
            continue  # tests/, build trees, third-party files
        here = room_of(rel, rooms)
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            target_top = target.split("/")[0]
            if target_top not in FOLDERS and target_top not in ("datasets", "model"):
                continue  # a header of the same folder by its plain name, or a third-party one
            checked += 1
            if here is not None:
                allowed_top = {"base"} | ({"datasets"} if here.startswith("model/") else set())
                there = room_of(target, rooms)
                if there is None and target.startswith("datasets/") and target.count("/") == 1:
                    continue  # datasets/dataset_error.h: the data layer's floor
                if there == here or (there is None and target_top == "base"):
                    continue
                if there is not None and there in below[here]:
                    continue
                if there is None and target_top in allowed_top:
                    problems.append(f"{rel}:{number}: includes {target}, which is in no room")
                    continue
                rule = (f"{here} may include {', '.join(sorted(below[here])) or 'no other room'}"
                        " (and base/)")
                problems.append(f"{rel}:{number}: includes {target}: {rule}")
            else:
                if target_top in FOLDERS[top] or (target_top in ("datasets", "model") and
                                                   target_top in FOLDERS[top]):
                    continue
                if top == "graph" and target_top == "graph":
                    continue
                problems.append(f"{rel}:{number}: includes {target}: {top}/ may include "
                                f"{', '.join(sorted(FOLDERS[top]))}")
    for p in problems:
        print(p)
    print(f"check_layers: {checked} includes of the tree's layers checked against {len(rooms)} rooms, "
          f"{len(problems)} out of place")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
