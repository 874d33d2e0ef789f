#!/usr/bin/env python3
"""check_layers.py: common/'s floors, read from its #include lines (tests/test_layers.sh runs it).

    tests/check_layers.py [ROOT]     # ROOT: a tree holding common/ (default: the repository)
    tests/check_layers.py --floors   # the folders, bottom first, one a line (for the nm check)

common/ is in folders by family, and the folders are floors: a file may include its own folder's
headers and those of the floors below, never one above (LAYERS, bottom first; common/README.md
draws the same list). Prints one PASS or FAIL line per check:
- every file of common/ sits in a folder of LAYERS, and every folder of common/ is one of them;
- common/README.md lists the folders in LAYERS' order;
- every include of ours names its folder ("runtime/dist.h", not "dist.h"), and the file exists;
- no include climbs: each FAIL names the file, what it includes and both floors;
- the modules (x.h with x.c; x_internal.h, what x's files share, counts as x's) include each
  other without a circle, within a floor too: a FAIL names the circle.
Exit status 1 when any check fails.
"""
import os
import re
import sys

# Bottom to top. A floor may use the floors below it; none uses one above it.
LAYERS = ["base", "runtime", "tensor", "comm", "data", "models", "parallel", "records", "train"]
FLOOR = {name: i + 1 for i, name in enumerate(LAYERS)}
SOURCES = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

if sys.argv[1:] == ["--floors"]:
    print("\n".join(LAYERS))
    sys.exit(0)
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
common = os.path.join(root, "common")
failed = 0


def report(ok, text):
    global failed
    print(("PASS" if ok else "FAIL") + " layers: " + text)
    failed += not ok


# --- the tree: every file in a folder that is a floor
strays, unknown, files = [], [], []
for entry in sorted(os.listdir(common)):
    path = os.path.join(common, entry)
    if os.path.isdir(path):
        if entry not in FLOOR:
            unknown.append(entry + "/")
            continue
        for name in sorted(os.listdir(path)):
            if os.path.isdir(os.path.join(path, name)):
                strays.append(f"{entry}/{name}/")
            elif name.endswith(SOURCES):
                files.append(f"{entry}/{name}")
    elif entry != "README.md":
        strays.append(entry)
report(not strays and not unknown,
       f"common/'s {len(files)} source files are in its {len(LAYERS)} folders, one per floor"
       if not strays and not unknown else
       "files outside the floors' folders: " + " ".join(f"common/{s}" for s in strays + unknown) +
       f" (each file goes in one of {', '.join(LAYERS)}: common/README.md says which holds what)")

# --- common/README.md draws the same floors, in the same order
readme = os.path.join(common, "README.md")
drawn = []
if os.path.exists(readme):
    drawn = re.findall(r"^\s*\d+\s+([a-z_]+)/", open(readme, encoding="utf-8").read(), re.M)
report(drawn == LAYERS, "common/README.md draws the floors in order: " + " < ".join(LAYERS) if drawn == LAYERS else
       f"common/README.md draws the floors {drawn}, tests/check_layers.py has {LAYERS}")

# --- the includes of common/: by folder, existing, never climbing
edges = {}  # module "folder/stem" -> {module: the include line that made the arrow}
bare, missing, climbs, count = [], [], [], 0
def module(path):  # "parallel/ddp_internal.h" -> "parallel/ddp"
    stem = path.rsplit(".", 1)[0]
    return stem[: -len("_internal")] if stem.endswith("_internal") else stem


for f in files:
    folder = f.split("/")[0]
    me = module(f)
    edges.setdefault(me, {})
    for target in INCLUDE.findall(open(os.path.join(common, f), encoding="utf-8").read()):
        count += 1
        if "/" not in target:
            bare.append(f"common/{f} includes \"{target}\"")
            continue
        if not os.path.exists(os.path.join(common, target)):
            missing.append(f"common/{f} includes \"{target}\", which is not in common/")
            continue
        their = target.split("/")[0]
        if FLOOR[their] > FLOOR[folder]:
            climbs.append(f"common/{f} (floor {FLOOR[folder]}, {folder}) includes {target} "
                          f"(floor {FLOOR[their]}, {their})")
        if module(target) != me:
            edges[me].setdefault(module(target), f"common/{f} includes {target}")
report(not bare and not missing, f"each of common/'s {count} includes of its own names the folder and the file"
       if not bare and not missing else "; ".join(bare + missing) + " (an include names its folder: \"runtime/dist.h\")")
report(not climbs, f"no include of common/ climbs a floor ({count} includes)" if not climbs else
       "includes that climb a floor: " + "; ".join(climbs))


# --- no circle: a depth-first walk that reports the first loop it meets, arrow by arrow
def find_circle():
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == "open":
                loop = stack[stack.index(nxt):] + [nxt]
                return [edges[a][b] for a, b in zip(loop, loop[1:])]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


circle = find_circle()
arrows = sum(len(v) for v in edges.values())
report(circle is None, f"common/'s {len(edges)} modules include each other without a circle ({arrows} arrows)"
       if circle is None else "a circle of includes: " + ", then ".join(circle))

sys.exit(1 if failed else 0)
