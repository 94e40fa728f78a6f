#!/usr/bin/env bash
# check_includes: the include directions between processor/'s folders
# (docs/design.md, "The map"). Every quoted include names its folder
# ("redis/store.h") and points at a file that exists; a folder includes
# only the folders its rule lists (its own always); processor/ itself
# holds only main.c and include/. An exception is one file -> one header,
# with the reason and the work that removes it; an exception no longer
# used fails too, so the list only shrinks. Run by `make check`.
set -euo pipefail
cd "$(dirname "$0")/.."

# folder -> the folders it may include, read from the one place they are
# written: the block after "Include directions" in docs/design.md ("folder
# -> folders"; "nothing" is none, "(and the public header)" is idemproc/,
# processor/include/idemproc/).
declare -A ALLOW=()
while read -r folder arrow rest; do
    [ "$arrow" = "->" ] || continue
    rest=${rest/(and the public header)/idemproc}
    [ "$rest" = nothing ] && rest=
    ALLOW[$folder]=$rest
done < <(awk '/^Include directions/ { f = 1 }
    f && /^```/ { if (inb) exit; inb = 1; next }
    inb' docs/design.md)
if [ ${#ALLOW[@]} -eq 0 ]; then
    echo "check-includes: no include directions found in docs/design.md" >&2
    exit 1
fi

# file -> header the rules do not allow (yet): why, and what removes it.
# None today: each module declares and checks its own configuration keys.
EXCEPTIONS="
"

fail=0
say() {
    echo "check-includes: $*" >&2
    fail=1
}

for f in processor/*; do
    case $f in
    processor/main.c | processor/include) ;;
    *) [ -d "$f" ] || say "$f: processor/ holds only main.c, include/ and folders" ;;
    esac
done

declare -A used=()
while IFS= read -r src; do
    rel=${src#processor/}
    case $rel in
    */*) folder=${rel%%/*} ;;
    *) folder=main ;;
    esac
    [ "$folder" = include ] && continue
    if [ -z "${ALLOW[$folder]+set}" ]; then
        say "$src: folder '$folder' has no rule (add it to docs/design.md's include directions)"
        continue
    fi
    while IFS=: read -r line inc; do
        case $inc in
        */*) ;;
        *)
            say "$src:$line: #include \"$inc\" must name its folder"
            continue
            ;;
        esac
        to=${inc%%/*}
        if [ "$to" = idemproc ]; then
            [ -f "processor/include/$inc" ] || say "$src:$line: no processor/include/$inc"
        elif [ ! -f "processor/$inc" ]; then
            say "$src:$line: no processor/$inc"
            continue
        fi
        [ "$to" = "$folder" ] && continue
        case " ${ALLOW[$folder]} " in *" $to "*) continue ;; esac
        if grep -qx "$rel $inc" <<<"$EXCEPTIONS"; then
            used["$rel $inc"]=1
            continue
        fi
        say "$src:$line: $folder/ may not include $inc (allowed: ${ALLOW[$folder]:-nothing})"
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$src" |
        sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1:\2/')
done < <(find processor -name '*.[ch]' | sort)

while IFS= read -r ex; do
    [ -n "$ex" ] || continue
    [ -n "${used[$ex]+set}" ] || say "exception '$ex' is no longer needed: remove it"
done <<<"$EXCEPTIONS"

if [ $fail -ne 0 ]; then
    echo "check-includes: failed (rules in docs/design.md, exceptions in tests/check_includes.sh)" >&2
    exit 1
fi
echo "check-includes: ok"
