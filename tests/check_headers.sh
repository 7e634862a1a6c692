#!/usr/bin/env bash
# Checks that the public headers are the manual and that docs/ops.md tells the
# truth (bash and awk only: CI machines may lack Python).
#
#   bash tests/check_headers.sh include/ebb
#
# 1. Every EBB_API declaration has its own comment directly above it: the line
#    before it ends a comment ("*/") and is not a section ruler ("/* ---- x */").
# 2. Every function of an ebb_ name declared at top level in a header carries
#    EBB_API, so nothing public is left out of the shared library.
# 3. The ops docs/ops.md documents (its "### `name`" headings, and the ops
#    named in ebb_node_op(b, "name", ...) examples) are exactly the ops the
#    registry's tables in ops/*.c define.
#
# Prints FILE:LINE: what for each problem and exits 1 if there is any.
set -u

inc=${1:-include/ebb}
if [ ! -d "$inc" ]; then
    echo "check_headers.sh: no such directory: $inc" >&2
    exit 2
fi
root=$(cd "$inc/../.." && pwd)
fail=0

# ---- 1 and 2: the headers ---------------------------------------------------
out=$(awk '
    FNR == 1 { prev = ""; in_comment = 0 }
    {
        line = $0
        # a declaration at top level: not indented, not a preprocessor line,
        # not inside a block comment
        top = !in_comment && line ~ /^[A-Za-z_]/
        if (top && line ~ /^EBB_API/) {
            name = line
            if (match(name, /ebb_[A-Za-z0-9_]+[ \t]*\(/))
                name = substr(name, RSTART, RLENGTH)
            sub(/[ \t]*\($/, "", name)
            if (prev !~ /^[ \t]*(\/\*|\*).*\*\/[ \t]*$/)
                printf "%s:%d: %s: no comment of its own directly above\n", FILENAME, FNR, name
            else if (prev ~ /^[ \t]*\/\*[ \t]*---/)
                printf "%s:%d: %s: only a section ruler above, no comment of its own\n",
                       FILENAME, FNR, name
        } else if (top && line !~ /^(typedef|static|#|extern|struct|enum|union)/ &&
                   match(line, /[^A-Za-z0-9_]ebb_[A-Za-z0-9_]+[ \t]*\(/)) {
            name = substr(line, RSTART + 1, RLENGTH - 1)
            sub(/[ \t]*\($/, "", name)
            printf "%s:%d: %s: declared without EBB_API (not exported)\n", FILENAME, FNR, name
        }
        # track block comments (a comment opened and closed on one line
        # leaves the state as it was)
        tmp = line
        while (tmp != "") {
            if (in_comment) {
                i = index(tmp, "*/")
                if (!i) break
                in_comment = 0
                tmp = substr(tmp, i + 2)
            } else {
                i = index(tmp, "/*")
                if (!i) break
                in_comment = 1
                tmp = substr(tmp, i + 2)
            }
        }
        prev = line
    }
' "$inc"/*.h)
if [ -n "$out" ]; then
    echo "$out"
    echo "check_headers.sh: public functions without their own comment or without EBB_API:" \
         "$(echo "$out" | wc -l)" >&2
    fail=1
fi

# ---- 3: docs/ops.md against the registry -------------------------------------
ops_md=$root/docs/ops.md
if [ -f "$ops_md" ] && ls "$root"/ops/*.c > /dev/null 2>&1; then
    # The op tables: `const ebb_op ebb_ops_X[] = { ... };`, whose entries are
    # {.name = "op", ...} or a macro whose first argument is the name.
    registered=$(awk '
        /^(static )?const ebb_op [A-Za-z0-9_]+\[\][ \t]*=[ \t]*\{/ { t = 1 }
        t {
            s = $0
            while (match(s, /\.name[ \t]*=[ \t]*"[^"]+"/)) {
                n = substr(s, RSTART, RLENGTH)
                sub(/^[^"]*"/, "", n); sub(/"$/, "", n)
                print n
                s = substr(s, RSTART + RLENGTH)
            }
            if (match($0, /^[ \t]*[A-Z_][A-Z0-9_]*\([ \t]*"[^"]+"/)) {
                n = substr($0, RSTART, RLENGTH)
                sub(/^[^"]*"/, "", n); sub(/"$/, "", n)
                print n
            }
        }
        t && /^};/ { t = 0 }
    ' "$root"/ops/*.c | sort -u)
    n_registered=$(printf '%s\n' "$registered" | grep -c .)
    if [ "$n_registered" -lt 10 ]; then
        echo "check_headers.sh: found only $n_registered ops in $root/ops/*.c: the table parser" \
             "needs updating" >&2
        fail=1
    else
        # FILE:LINE:op for every op the document names
        documented=$(awk -v F="$ops_md" '
            /^### / {
                s = $0
                while (match(s, /`[A-Za-z0-9_]+`/)) {
                    printf "%s:%d:%s\n", F, FNR, substr(s, RSTART + 1, RLENGTH - 2)
                    s = substr(s, RSTART + RLENGTH)
                }
            }
            {
                s = $0
                while (match(s, /ebb_node_op\([^,]*,[ \t]*"[^"]+"/)) {
                    n = substr(s, RSTART, RLENGTH)
                    sub(/^[^"]*"/, "", n); sub(/"$/, "", n)
                    printf "%s:%d:%s\n", F, FNR, n
                    s = substr(s, RSTART + RLENGTH)
                }
            }
        ' "$ops_md")
        while IFS= read -r entry; do
            [ -n "$entry" ] || continue
            op=${entry##*:}
            if ! printf '%s\n' "$registered" | grep -qx -- "$op"; then
                echo "${entry%:*}: $op: documented but no such op is registered"
                fail=1
            fi
        done <<< "$documented"
        while IFS= read -r op; do
            [ -n "$op" ] || continue
            if ! printf '%s\n' "$documented" | grep -q -- ":$op\$"; then
                echo "$ops_md: $op: registered (ops/*.c) but not documented"
                fail=1
            fi
        done <<< "$registered"
    fi
fi

exit $fail
