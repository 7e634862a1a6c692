#!/usr/bin/env bash
# Checks that the command output README.md and docs/*.md show is what the code
# prints now (bash and awk only: CI machines may lack Python).
#
#   bash tests/check_docs.sh [--update] [-j N] [--ebb PATH] [FILE.md...]
#
# A checked block is a fenced block with a marker comment on the line above
# it. The block is a shell transcript: a line starting with `$ ` is a command
# (a line ending in `\` goes on on the next), and the lines up to the next
# command are its output: what it writes to stdout, then what it writes to
# stderr (so the order does not hang on buffering):
#
#   <!-- check -->
#   ```
#   $ ebb plan specs/mlp.yaml -i batch=8
#   plan mlp
#   ...
#   ```
#
# The marker may say more, in this order:
#   <!-- check exit=2 -->                 every command of the block exits 2
#                                         (default 0)
#   <!-- check setup: SHELL COMMAND -->   run first, its output unchecked, to
#                                         make the files the block reads
#
# Each block runs in a fresh scratch directory that looks like the repository
# root (its top-level entries linked in, so paths print as in the docs), with
# the ebb under test first on PATH and as build/ebb, and a small dataset,
# d.safetensors (x float32 [96, 64], y int64 [96], what specs/mlp.yaml
# trains on). Commands run under bash -o pipefail, stdin /dev/null, one
# thread, the CPU only.
#
# A line `...` in a block stands for any number of lines, and `...` inside a
# line for any text. Use it sparingly: for what depends on the machine
# (times), or to skip lines of an output no command cuts cleanly (a JSON
# excerpt). To show part of a long output, cut it with the command itself
# (`| grep ...`, `| sed -n ...`; not `| head`, whose early exit makes ebb
# exit 141) so that the block stays checked line for line.
#
# Each block that differs is reported as FILE:LINE of its opening fence, with
# a diff from the docs' text to the output, and the exit status is 1.
#
# Refreshing: after a change that is meant to alter documented output (a help
# text, a listing), run
#
#   bash tests/check_docs.sh --update
#
# which rewrites each block that differs with the new output, keeping its
# `...` elisions where the lines around them still match (a wrong exit status
# or a failed setup it leaves to you). Read the diff (git diff README.md
# docs/) before committing it: the prose around a block may need the new
# figures too. `bash tests/check_docs.sh --update docs/cli.md` refreshes one
# file.
#
# --ebb PATH picks the ebb to run (default: build/ebb); -j N runs N blocks
# at a time (default: the CPUs). FILE.md... limits the check to those files.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
update=0
ebb=$root/build/ebb
jobs=$(nproc 2> /dev/null || echo 2)
files=()
while [ $# -gt 0 ]; do
    case $1 in
        --update) update=1 ;;
        -j) jobs=$2; shift ;;
        -j*) jobs=${1#-j} ;;
        --ebb) ebb=$2; shift ;;
        --ebb=*) ebb=${1#--ebb=} ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "check_docs.sh: unknown option $1" >&2; exit 2 ;;
        *) files+=("$1") ;;
    esac
    shift
done
if [ ! -x "$ebb" ]; then
    echo "check_docs.sh: no ebb at $ebb (build it, or give --ebb PATH)" >&2
    exit 2
fi
ebb=$(cd "$(dirname "$ebb")" && pwd)/$(basename "$ebb")
if [ ${#files[@]} -eq 0 ]; then
    files=("$root/README.md" "$root"/docs/*.md)
fi
for i in "${!files[@]}"; do
    f=${files[$i]}
    [ "${f#/}" = "$f" ] && f=$PWD/$f
    files[$i]=$f
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ebb-check-docs.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT

# What the output may depend on besides the code: one thread, the CPU, no
# distributed job around, a fixed locale and width.
export OMP_NUM_THREADS=1 EBB_NUM_THREADS=1 MKL_NUM_THREADS=1
export CUDA_VISIBLE_DEVICES= LC_ALL=C TZ=UTC COLUMNS=80
unset WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT EBB_TEST_OPS EBB_TEST_DEVICE \
      EBB_TEST_SHARD GLIBC_TUNABLES
mkdir -p "$work/bin"
ln -s "$ebb" "$work/bin/ebb"
export PATH=$work/bin:$PATH

# d.safetensors: 96 samples of specs/mlp.yaml's x [batch, 64] and y [batch],
# x's elements in {-1, -0.5, 0, 0.5, 1}, y = i mod 10.
make_dataset() {
    local header='{"x":{"dtype":"F32","shape":[96,64],"data_offsets":[0,24576]},"y":{"dtype":"I64","shape":[96],"data_offsets":[24576,25344]}}'
    while [ $(( ${#header} % 8 )) -ne 0 ]; do header+=' '; done
    local f=('\x00\x00\x80\xbf' '\x00\x00\x00\xbf' '\x00\x00\x00\x00' '\x00\x00\x00\x3f'
             '\x00\x00\x80\x3f')
    local n=${#header} data='' i j
    printf -v data '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8))
    data+=$header
    for ((i = 0; i < 96; i++)); do
        for ((j = 0; j < 64; j++)); do data+=${f[$(((i * 7 + j * 3) % 5))]}; done
    done
    for ((i = 0; i < 96; i++)); do
        data+=$(printf '\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00\\x00' $((i % 10)))
    done
    printf '%b' "$data" > "$1"
}
make_dataset "$work/d.safetensors"

# ---- the blocks ---------------------------------------------------------------
# Block K: $work/K.where (FILE:LINE of the fence), K.meta (file, marker line,
# first and last content lines, indent, exit), K.setup, K.expect (the block's
# text, unindented).
awk -v W="$work" '
    function flush_err(msg) { printf "%s:%d: %s\n", FILENAME, FNR, msg > (W "/errors"); }
    FNR == 1 { state = 0 }
    state == 0 && /^[ \t]*<!-- check( .*)? -->[ \t]*$/ {
        m = $0
        sub(/^[ \t]*<!-- check/, "", m); sub(/ -->[ \t]*$/, "", m)
        code = 0; setup = ""
        if (match(m, /^ exit=[0-9]+/)) {
            code = substr(m, RSTART + 6, RLENGTH - 6) + 0
            m = substr(m, RSTART + RLENGTH)
        }
        if (match(m, /^ setup: /)) {
            setup = substr(m, RLENGTH + 1)
            m = ""
        }
        if (m != "") flush_err("cannot read the marker (\"<!-- check [exit=N] [setup: CMD] -->\")")
        marker = FNR; state = 1; next
    }
    state == 1 {
        if (!match($0, /^[ \t]*```/)) {
            flush_err("a check marker must be followed by a fenced block")
            state = 0; next
        }
        indent = RLENGTH - 3
        k++
        base = W "/" k
        printf "%s:%d\n", FILENAME, FNR > (base ".where"); close(base ".where")
        fence = FNR; state = 2; n = 0
        printf "" > (base ".expect")
        next
    }
    state == 2 {
        if ($0 ~ /^[ \t]*```[ \t]*$/) {
            printf "%s\n%d\n%d\n%d\n%d\n%d\n", FILENAME, marker, fence + 1, FNR - 1, indent, code \
                > (base ".meta")
            close(base ".meta")
            printf "%s", setup > (base ".setup"); close(base ".setup")
            close(base ".expect")
            state = 0; next
        }
        line = $0
        for (i = 0; i < indent && substr(line, 1, 1) == " "; i++) line = substr(line, 2)
        print line > (base ".expect")
    }
    END { print k + 0 > (W "/count") }
' "${files[@]}"
if [ -s "$work/errors" ]; then
    cat "$work/errors"
    exit 1
fi
n_blocks=$(cat "$work/count")
if [ "$n_blocks" -eq 0 ]; then
    echo "check_docs.sh: no <!-- check --> blocks in ${files[*]}" >&2
    exit 1
fi

# Runs block K in its own scratch directory: K.actual (the transcript),
# K.problems (a wrong exit status, a failed setup).
run_block() {
    local k=$1 dir=$work/run$1 entry want cmd shown line rc
    mkdir -p "$dir/build"
    for entry in "$root"/* "$root"/.[!.]*; do
        case ${entry##*/} in build|build-*|.git|.gl) continue ;; esac
        [ -e "$entry" ] && ln -s "$entry" "$dir/${entry##*/}"
    done
    ln -s "$ebb" "$dir/build/ebb"
    cp "$work/d.safetensors" "$dir/"
    want=$(sed -n 6p "$work/$k.meta")
    : > "$work/$k.actual"
    : > "$work/$k.problems"
    cd "$dir" || return
    if [ -s "$work/$k.setup" ] &&
       ! timeout 300 bash -o pipefail -c "$(cat "$work/$k.setup")" > setup.log 2>&1 < /dev/null; then
        { echo "the setup failed: $(cat "$work/$k.setup")"; sed 's/^/  /' setup.log; } \
            >> "$work/$k.problems"
    fi
    # a command is its `$ ` line and the lines a trailing `\` continues it on
    run_cmd() {
        [ -n "$cmd" ] || return 0
        printf '%s\n' "$shown" >> "$work/$k.actual"
        timeout 300 bash -o pipefail -c "$cmd" > out 2> err < /dev/null
        rc=$?
        for f in out err; do
            cat $f >> "$work/$k.actual"
            [ -s $f ] && [ "$(tail -c 1 $f | od -An -c | tr -d ' ')" != '\n' ] &&
                echo >> "$work/$k.actual"
        done
        [ "$rc" -ne "$want" ] &&
            echo "\`${cmd%%$'\n'*}\` exited $rc, the docs say $want" >> "$work/$k.problems"
        cmd= shown=
    }
    cmd= shown=
    local cont=0
    while IFS= read -r line; do
        if [ "$cont" -eq 1 ]; then
            cmd+=$'\n'$line shown+=$'\n'$line
        elif [ "${line:0:2}" = '$ ' ]; then
            run_cmd
            cmd=${line:2} shown=$line
        else
            continue
        fi
        case $line in *\\) cont=1 ;; *) cont=0 ;; esac
    done < "$work/$k.expect"
    run_cmd
}

# A block whose commands, setup and exit status are another's (the same
# listing shown in two places) reuses that one's run.
declare -A first_of
for ((k = 1; k <= n_blocks; k++)); do
    key=$({ sed -n 6p "$work/$k.meta"; cat "$work/$k.setup"; echo
            awk 'c || /^\$ / { print; c = /\\$/; next } { c = 0 }' "$work/$k.expect"; } |
          cksum)
    if [ -n "${first_of[$key]:-}" ]; then
        echo "${first_of[$key]}" > "$work/$k.same"
        continue
    fi
    first_of[$key]=$k
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    ( run_block "$k" ) &
done
wait
for ((k = 1; k <= n_blocks; k++)); do
    if [ -f "$work/$k.same" ]; then
        same=$(cat "$work/$k.same")
        cp "$work/$same.actual" "$work/$k.actual"
        cp "$work/$same.problems" "$work/$k.problems"
    fi
done

# ---- comparing ----------------------------------------------------------------
# Matches the docs' text (first file) against the output (second file), a
# line `...` taking any number of lines and `...` in a line any text. With
# mode=update, prints the output with the docs' elisions kept: the lines of
# the longest common alignment keep the docs' text, and the output's lines
# in a gap whose docs' side holds a `...` line stay `...`.
compare_awk='
    function glob(p, s,   n, parts, i, at, pos) {
        if (p == s) return 1
        if (index(p, "...") == 0) return 0
        n = split(p, parts, /\.\.\./)
        if (substr(s, 1, length(parts[1])) != parts[1]) return 0
        pos = length(parts[1]) + 1
        for (i = 2; i < n; i++) {
            at = index(substr(s, pos), parts[i])
            if (!at) return 0
            pos += at - 1 + length(parts[i])
        }
        return length(s) - pos + 1 >= length(parts[n]) &&
               substr(s, length(s) - length(parts[n]) + 1) == parts[n]
    }
    FNR == NR { e[++n] = $0; next }
    { a[++m] = $0 }
    END {
        if (mode != "update") {
            for (j = m + 1; j >= 1; j--) ok[n + 1, j] = (j == m + 1)
            for (i = n; i >= 1; i--)
                for (j = m + 1; j >= 1; j--) {
                    if (e[i] == "...") ok[i, j] = ok[i + 1, j] || (j <= m && ok[i, j + 1])
                    else ok[i, j] = j <= m && glob(e[i], a[j]) && ok[i + 1, j + 1]
                }
            exit !ok[1, 1]
        }
        for (i = n + 1; i >= 1; i--)
            for (j = m + 1; j >= 1; j--) {
                if (i > n || j > m) { s[i, j] = 0; continue }
                best = s[i + 1, j]
                if (s[i, j + 1] > best) best = s[i, j + 1]
                if (e[i] != "..." && glob(e[i], a[j]) && s[i + 1, j + 1] + 1 > best)
                    best = s[i + 1, j + 1] + 1
                s[i, j] = best
            }
        i = 1; j = 1; ne = 0; pending = 0
        while (i <= n || j <= m) {
            if (i <= n && j <= m && e[i] != "..." && glob(e[i], a[j]) &&
                s[i, j] == s[i + 1, j + 1] + 1) {
                gap()
                print e[i]; i++; j++
            } else if (i <= n && (j > m || s[i, j] == s[i + 1, j])) {
                gap_e[++ne] = e[i]; i++
            } else {
                held[++pending] = a[j]; j++
            }
        }
        gap()
    }
    # The docs side of a gap is P lines, then from its first to its last
    # `...`, then S lines: the output side keeps its first P and last S lines
    # and elides the rest, if it has more than P + S.
    function gap(   t, first, last, p, q) {
        first = 0
        for (t = 1; t <= ne; t++)
            if (gap_e[t] == "...") { if (!first) first = t; last = t }
        p = first - 1; q = ne - last
        if (!first || pending <= p + q) {
            for (t = 1; t <= pending; t++) print held[t]
        } else {
            for (t = 1; t <= p; t++) print held[t]
            print "..."
            for (t = pending - q + 1; t <= pending; t++) print held[t]
        }
        ne = 0; pending = 0
    }
'

fail=0
n_updated=0
for ((k = 1; k <= n_blocks; k++)); do
    where=$(cat "$work/$k.where")
    where=${where#"$root"/}
    if [ -s "$work/$k.problems" ]; then
        echo "$where: $(head -1 "$work/$k.problems")"
        tail -n +2 "$work/$k.problems"
        fail=1
        [ $update -eq 1 ] && echo "$where: not updated: fix the command or the marker by hand"
        continue
    fi
    awk "$compare_awk" "$work/$k.expect" "$work/$k.actual" && continue
    if [ $update -eq 1 ]; then
        awk -v mode=update "$compare_awk" "$work/$k.expect" "$work/$k.actual" > "$work/$k.new"
        echo "$where: updated"
        n_updated=$((n_updated + 1))
        continue
    fi
    echo "$where: the block differs from what the code prints (- the docs, + the code):"
    diff -u --label "$where" --label "output" "$work/$k.expect" "$work/$k.actual" | tail -n +3
    fail=1
done

# ---- --update: write the new blocks back, last first so line numbers hold ---
if [ $update -eq 1 ]; then
    for f in "${files[@]}"; do
        for ((k = n_blocks; k >= 1; k--)); do
            [ -f "$work/$k.new" ] || continue
            [ "$(sed -n 1p "$work/$k.meta")" = "$f" ] || continue
            first=$(sed -n 3p "$work/$k.meta"); last=$(sed -n 4p "$work/$k.meta")
            indent=$(sed -n 5p "$work/$k.meta")
            awk -v first="$first" -v last="$last" -v ind="$indent" -v new="$work/$k.new" '
                NR == first {
                    pad = sprintf("%" ind "s", "")
                    while ((getline l < new) > 0) print (l == "" ? "" : pad l)
                }
                NR >= first && NR <= last { next }
                { print }
            ' "$f" > "$work/spliced" && cat "$work/spliced" > "$f"
        done
    done
fi

if [ $update -eq 1 ]; then
    echo "check_docs.sh: updated $n_updated of $n_blocks blocks"
elif [ $fail -eq 0 ]; then
    echo "check_docs.sh: $n_blocks blocks match the code"
else
    echo "check_docs.sh: run 'bash tests/check_docs.sh --update' to take the code's output" \
         "(then read the diff)" >&2
fi
exit $fail
