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

# folder -> the folders it may include. idemproc/ is the public plugin
# header (processor/include/idemproc/).
declare -A ALLOW=(
    [main]="cmd conf kafka redis base"
    [cmd]="loop effect handlers outbox dev redis kafka input obs conf base"
    [dev]="redis kafka input obs conf base"
    [outbox]="kafka obs conf base"
    [loop]="effect redis kafka input obs conf base"
    [handlers]="effect redis kafka input obs conf base idemproc"
    [effect]="redis kafka input obs conf base idemproc"
    [redis]="input obs conf base"
    [kafka]="input obs conf base"
    [input]="conf base"
    [obs]="base"
    [conf]="base"
    [base]=""
)

# file -> header the rules do not allow (yet): why, and what removes it.
# The configuration table is central today: conf.c checks every module's
# keys by calling into it, and conf.h embeds the retry tiers' type. Config
# by owner (each module declares and checks its own keys) removes these.
EXCEPTIONS="
conf/conf.h kafka/retrytopic.h
conf/conf.c kafka/retrytopic.h
conf/conf.c kafka/kafka.h
conf/conf.c loop/fetchwatch.h
conf/conf.c input/envelope.h
conf/conf.c effect/handler.h
conf/conf.c outbox/outboxrow.h
conf/conf.c redis/redisconn.h
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
        say "$src: folder '$folder' has no rule (add it to ALLOW here and to docs/design.md)"
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
    echo "check-includes: failed (rules in tests/check_includes.sh, docs/design.md)" >&2
    exit 1
fi
echo "check-includes: ok"
